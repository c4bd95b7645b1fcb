"""The long-lived Paddle Fleet parameter-server cluster and its Redis control plane.

One pass through this stage: a caller's ``ClusterClient.train(pass_id)`` appends a command;
every worker (``cluster_main``) reads it, evaluates the pass before training on it
(progressive validation), trains on it, all-reduces the metric sums (``metrics``) and
reports; ``checkpoint`` and ``export`` save through fleet. ``launcher`` runs it: one node
agent per host (``node_agent``), restarted together one ``generation`` at a time.
Paddle is imported inside functions only, so DAGs and CLIs import this package cheaply.
"""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers see; at run time a name's module loads on first use
    from trainers.control_plane import ClusterClient as ClusterClient
    from trainers.errors import (
        ClusterUnavailable as ClusterUnavailable,
        CommandFailed as CommandFailed,
        CommandTimeout as CommandTimeout,
        DeviceUnsupported as DeviceUnsupported,
        TrainerError as TrainerError,
    )
    from trainers.export_spec import ExportSpec as ExportSpec
    from trainers.hosts.node_agent import NodeAgent as NodeAgent
    from trainers.hosts.topology import Topology as Topology
    from trainers.launcher import LocalCluster as LocalCluster
    from trainers.metrics import (
        PassMetrics as PassMetrics,
        bucket_auc as bucket_auc,
        exact_auc as exact_auc,
        metrics_from_stats as metrics_from_stats,
    )
    from trainers.models import build_model as build_model


_EXPORTS = {
    "ClusterClient": "trainers.control_plane",
    "ClusterUnavailable": "trainers.errors",
    "CommandFailed": "trainers.errors",
    "CommandTimeout": "trainers.errors",
    "DeviceUnsupported": "trainers.errors",
    "ExportSpec": "trainers.export_spec",
    "LocalCluster": "trainers.launcher",
    "NodeAgent": "trainers.hosts.node_agent",
    "Topology": "trainers.hosts.topology",
    "build_model": "trainers.models",
    "PassMetrics": "trainers.metrics",
    "TrainerError": "trainers.errors",
    "bucket_auc": "trainers.metrics",
    "exact_auc": "trainers.metrics",
    "metrics_from_stats": "trainers.metrics",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
