"""Operating a pipeline: the ``streamrec`` CLI, status of recent passes, the HTML report
and its charts (``line_chart``, for any page of plots), each served version's online
metrics and the alarm and canary judged on them (``online``), retention, and Airflow's
services run locally. It reads what every stage left behind, so it imports the stages; no stage
imports it."""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers see; at run time a name's module loads on first use
    from ops.airflow_local import LocalAirflow as LocalAirflow
    from ops.charts import (
        ReferenceLine as ReferenceLine,
        Series as Series,
        YRange as YRange,
        line_chart as line_chart,
    )
    from ops.online import (
        OnlineCheck as OnlineCheck,
        VersionOnline as VersionOnline,
        judge_online as judge_online,
    )
    from ops.retention import Deletion as Deletion, RetentionResult as RetentionResult
    from ops.status import (
        PassRow as PassRow,
        flag_untrained as flag_untrained,
        recent_passes as recent_passes,
    )


_EXPORTS = {
    "Deletion": "ops.retention",
    "LocalAirflow": "ops.airflow_local",
    "OnlineCheck": "ops.online",
    "VersionOnline": "ops.online",
    "judge_online": "ops.online",
    "PassRow": "ops.status",
    "ReferenceLine": "ops.charts",
    "RetentionResult": "ops.retention",
    "Series": "ops.charts",
    "YRange": "ops.charts",
    "flag_untrained": "ops.status",
    "line_chart": "ops.charts",
    "recent_passes": "ops.status",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
