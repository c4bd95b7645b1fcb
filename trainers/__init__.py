"""The long-lived Paddle Fleet parameter-server cluster and its Redis control plane.

One pass through this stage: a caller's ``ClusterClient.train(pass_id)`` appends a command;
every worker (``cluster_main``) reads it, evaluates the pass before training on it
(progressive validation), trains on it, all-reduces the metric sums (``metrics``) and
reports; ``checkpoint`` and ``export`` save through fleet. ``launcher`` runs it: one node
agent per host (``node_agent``), restarted together one ``generation`` at a time.
Paddle is imported inside functions only, so DAGs and CLIs import this package cheaply.
"""

from streamrec.lazy import lazy_exports

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
