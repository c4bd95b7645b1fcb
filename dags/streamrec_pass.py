"""
### streamrec_pass: train, gate and deliver one pass

One run per pass window: the run's data interval is the pass's event-time window, and its
start is the pass id (`YYYYMMDDHHMM`, UTC). Every task is a thin call into a package.

| task | calls | outcome |
| --- | --- | --- |
| `wait_pass` | `passes.is_complete` | sensor (reschedule mode) until the pass has `_SUCCESS` |
| `train_pass` | `ClusterClient.train` | progressive validation, training, checkpoint (delta/base) |
| `evaluate` | `delivery.evaluate` | the quality-gate decision, stored on the pass |
| `maintain` | `ClusterClient.maintain_if_day_ends` | after a day's last pass: shrink, daily save |
| `export` | `ClusterClient.export`, `delivery.publish` | a verified artifact; skipped on reject |
| `deliver` | `delivery.deliver` | serving pointer switched; an event on the serving-model asset |

Every step is idempotent per pass (a retry or a re-run does not train twice), so tasks
retry freely. The pipeline config comes from `STREAMREC_CONFIG`; the schedule's period
from `STREAMREC_PASS_MINUTES`, which must equal the config's `passes.pass_minutes`.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

import pendulum
from airflow.sdk import Asset, PokeReturnValue, dag, task
from airflow.sdk.exceptions import AirflowSkipException

PASS_MINUTES = int(os.environ.get("STREAMREC_PASS_MINUTES", "10"))
SERVING_MODEL = Asset("streamrec_serving_model")


def _config():
    from streamrec.config import load_config
    from streamrec.errors import ConfigError

    path = os.environ.get("STREAMREC_CONFIG")
    if not path:
        raise ConfigError("STREAMREC_CONFIG is not set: point it at the pipeline YAML")
    cfg = load_config(path)
    if cfg.passes.pass_minutes != PASS_MINUTES:
        raise ConfigError(
            f"{path}: passes.pass_minutes is {cfg.passes.pass_minutes} but the DAG is "
            f"scheduled every {PASS_MINUTES} min: set STREAMREC_PASS_MINUTES to match"
        )
    return cfg


@dag(
    schedule=timedelta(minutes=PASS_MINUTES),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=20)},
    tags=["streamrec"],
    doc_md=__doc__,
)
def streamrec_pass():
    @task.sensor(poke_interval=5, timeout=3600, mode="reschedule")
    def wait_pass(data_interval_start: datetime | None = None) -> PokeReturnValue:
        from streamrec.passes import is_complete, pass_dir, pass_id_at

        pass_id = pass_id_at(data_interval_start)
        done = is_complete(pass_dir(_config().paths.data_root, pass_id))
        return PokeReturnValue(is_done=done, xcom_value=pass_id)

    @task
    def train_pass(pass_id: str) -> dict[str, Any]:
        from trainers.control_plane import ClusterClient

        return ClusterClient.from_config(_config()).train(pass_id)

    @task
    def evaluate(train_result: dict[str, Any]) -> dict[str, Any]:
        from serving_export.delivery import evaluate

        return evaluate(_config(), train_result).to_dict()

    @task
    def maintain(pass_id: str) -> dict[str, Any]:
        from trainers.control_plane import ClusterClient

        cfg = _config()
        return ClusterClient.from_config(cfg).maintain_if_day_ends(pass_id, cfg.passes.pass_minutes)

    @task
    def export(pass_id: str, decision: dict[str, Any]) -> str:
        from serving_export.delivery import publish
        from serving_export.quality_gate import GateDecision
        from trainers.control_plane import ClusterClient

        if not decision["passed"]:
            raise AirflowSkipException(
                "quality gate rejected the pass: " + "; ".join(decision["reasons"])
            )
        cfg = _config()
        raw = ClusterClient.from_config(cfg).export(pass_id)["raw_export"]
        return publish(cfg, raw, GateDecision(**decision))["version"]

    @task(outlets=[SERVING_MODEL])
    def deliver(version: str, *, outlet_events=None) -> dict[str, Any]:
        from serving_export.delivery import deliver

        result = deliver(_config(), version)
        outlet_events[SERVING_MODEL].extra = result
        return result

    pass_id = wait_pass()
    trained = train_pass(pass_id)
    decision = evaluate(trained)
    maintained = maintain(pass_id)
    decision >> maintained
    version = export(pass_id, decision)
    maintained >> version
    deliver(version)


streamrec_pass()
