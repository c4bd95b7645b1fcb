"""The long-lived Paddle Fleet parameter-server cluster and its Redis control plane.

One pass through this stage: a caller's ``ClusterClient.train(pass_id)`` appends a command;
every worker (``cluster_main``) reads it, evaluates the pass before training on it
(progressive validation), trains on it, all-reduces the metric sums (``metrics``) and
reports; ``checkpoint`` and ``export`` save through fleet. ``launcher`` runs it locally.
Paddle is imported inside functions only, so DAGs and CLIs import this package cheaply.
"""

from trainers.control_plane import ClusterClient
from trainers.errors import (
    ClusterUnavailable,
    CommandFailed,
    CommandTimeout,
    DeviceUnsupported,
    TrainerError,
)
from trainers.launcher import LocalCluster
from trainers.metrics import PassMetrics, bucket_auc, exact_auc, metrics_from_stats
from trainers.models import MODELS

__all__ = [
    "MODELS",
    "ClusterClient",
    "ClusterUnavailable",
    "CommandFailed",
    "CommandTimeout",
    "DeviceUnsupported",
    "LocalCluster",
    "PassMetrics",
    "TrainerError",
    "bucket_auc",
    "exact_auc",
    "metrics_from_stats",
]
