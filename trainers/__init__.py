"""The long-lived Paddle Fleet parameter-server cluster and its Redis control plane.

One pass through this stage: a caller's ``ClusterClient.train(pass_id)`` appends a command;
every worker (``cluster_main``) reads it, evaluates the pass before training on it
(progressive validation), trains on it, all-reduces the metric sums (``metrics``) and
reports; ``checkpoint`` and ``export`` save through fleet. ``launcher`` runs it locally.
Paddle is imported inside functions only, so DAGs and CLIs import this package cheaply.
"""

import importlib
from typing import Any

# Exports load on first use (PEP 562), so importing one module of the package, as the
# pipe reader process or a DAG file does, does not import the whole stage.
_EXPORTS = {
    "ClusterClient": "trainers.control_plane",
    "ClusterUnavailable": "trainers.errors",
    "CommandFailed": "trainers.errors",
    "CommandTimeout": "trainers.errors",
    "DeviceUnsupported": "trainers.errors",
    "LocalCluster": "trainers.launcher",
    "MODELS": "trainers.models",
    "PassMetrics": "trainers.metrics",
    "TrainerError": "trainers.errors",
    "bucket_auc": "trainers.metrics",
    "exact_auc": "trainers.metrics",
    "metrics_from_stats": "trainers.metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
