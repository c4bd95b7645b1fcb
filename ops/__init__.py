"""Operating a pipeline: the ``streamrec`` CLI, status of recent passes, the HTML report,
retention, and Airflow's services run locally. It reads what every stage left behind, so
it imports the stages; no stage imports it."""

from streamrec.lazy import lazy_exports

_EXPORTS = {
    "Deletion": "ops.retention",
    "LocalAirflow": "ops.airflow_local",
    "PassRow": "ops.status",
    "RetentionResult": "ops.retention",
    "flag_untrained": "ops.status",
    "recent_passes": "ops.status",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
