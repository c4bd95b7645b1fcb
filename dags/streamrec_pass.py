"""
### streamrec_pass: one pass, watched or driven

One run per pass window, in order: the run's data interval **is** the pass's event-time
window (a `DeltaDataIntervalTimetable` of `passes.pass_seconds` from `schedule.start`,
rounded down to a window), and its start is the pass id (`YYYYMMDDHHMM`, UTC; with seconds
for passes under a minute). Catch-up is on and one run is active at a time, so windows
missed while Airflow, the builder or the cluster was down are run afterwards, oldest first.
Every task depends on its previous run: a run that failed holds the later ones until it is
cleared, so no pass is ever skipped.

As shipped (`cluster.follow_passes`, on by default) the cluster trains, judges and
delivers each pass itself the moment it is complete (`ops/pass_follower.py`), and a run is
two tasks that watch it: `watch_pass` (a sensor until the pass is finished: delivered,
rejected by the gate, or superseded) and `delivered` (the model asset's event; skipped when
the pass was not delivered), with `judge_online` beside them where there is a served log.

With `cluster.follow_passes: false` each run drives its pass, a task per step:

| task | calls | outcome |
| --- | --- | --- |
| `wait_pass` | `passes.pass_state` | until `_SUCCESS`; skips a window with no pass or caught up |
| `train_pass` | `ClusterClient.train` | progressive validation, training, checkpoint (delta/base) |
| `evaluate` | `delivery.evaluate` | the quality-gate decision, stored on the pass |
| `export` | `pass_sequence.export_and_publish` | the pass as an artifact; or skipped |
| `deliver` | `delivery.deliver` | the serving pointer moved; an event on the model asset |
| `day_end` | `pass_sequence.day_end` | after a day's last pass: shrink, retention |
| `catch_up` | `catchup.catch_up` | while behind: the complete passes after this one, the same way |
| `deliver_newest` | as `export`, then `deliver` | the newest pass `catch_up` trained; or skipped |
| `judge_online` | `online.judge_online` | online metrics, alarm, canary (only with a served log) |

The order is `ops/pass_sequence.py`'s (`run_pass`), which the demo and the serving tests
run whole. A pass is delivered as soon as its gate passes it; the day-end and catch-up
steps come after, off the path from training to serving (`day_end` runs whether or not the
pass was delivered). While behind (after an outage), the run's own pass is not exported:
`catch_up` trains up to `schedule.catchup_passes` complete passes after it, oldest first,
each with its gate decision and day-end maintenance, and only the newest is exported and
delivered; the runs of those passes then find them caught up and skip (`ops/catchup.py`).

A manual run (a trigger in the UI, `airflow dags test <date>`) covers the window that
*ends* at its date, as Airflow infers manual data intervals: the last complete window.

Every step is idempotent per pass (a retry or a re-run does not train twice), so tasks
retry freely, with exponential backoff (`schedule.task_retries`). The pipeline config comes
from `STREAMREC_CONFIG` and is read when the file is parsed: the schedule depends on it.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import (
    Asset,
    DeltaDataIntervalTimetable,
    PokeReturnValue,
    TriggerRule,
    dag,
    task,
)
from airflow.sdk.exceptions import AirflowSkipException

from streamrec.config import PipelineConfig, load_config
from streamrec.errors import ConfigError

if TYPE_CHECKING:
    from streamrec.contracts.delivery import GateDecision
    from trainers.control_plane import ClusterClient

log = logging.getLogger(__name__)
SERVING_MODEL = Asset("streamrec_serving_model")


def _config() -> PipelineConfig:
    path = os.environ.get("STREAMREC_CONFIG")
    if not path:
        raise ConfigError("STREAMREC_CONFIG is not set: point it at the pipeline YAML")
    cfg = load_config(path)
    if cfg.schedule is None:
        raise ConfigError(
            f"{path}: missing section 'schedule': add 'schedule: {{start: <UTC time your "
            "stream starts, e.g. 2026-11-23T08:00:00Z>}}' so Airflow knows its first window"
        )
    return cfg


def _skip_unless_passed(pass_id: str, decision: GateDecision) -> None:
    """Skip the task (and the delivery after it) when the gate rejected ``pass_id``."""
    if not decision.passed:
        raise AirflowSkipException(
            f"quality gate rejected pass {pass_id}: " + "; ".join(decision.reasons)
        )


def _client(cfg: PipelineConfig) -> ClusterClient:
    from trainers.control_plane import ClusterClient

    return ClusterClient.from_config(cfg)


def _deliver(cfg: PipelineConfig, version: str, outlet_events: Any) -> dict[str, Any]:
    """Make ``version`` serve; its delivery rides on the serving-model asset's event."""
    from serving_export.delivery import deliver

    result = deliver(cfg, version).to_wire()
    outlet_events[SERVING_MODEL].extra = result
    return result


CFG = _config()
SCHEDULE = CFG.schedule
CLOCK = CFG.passes.clock


def _pass_of(start: datetime | None) -> str:
    """The pass a run's data interval starts (Airflow gives every scheduled run one)."""
    if start is None:
        raise ValueError("a run without a data interval: trigger it for a logical date")
    return CLOCK.id_of(start)


assert SCHEDULE is not None  # _config checked it


@dag(
    schedule=DeltaDataIntervalTimetable(timedelta(seconds=CLOCK.seconds)),
    start_date=CLOCK.floor(SCHEDULE.start),
    catchup=True,
    max_active_runs=1,
    default_args={
        "owner": SCHEDULE.owner,
        "depends_on_past": True,
        "retries": SCHEDULE.task_retries,
        "retry_delay": timedelta(seconds=SCHEDULE.retry_delay_seconds),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(seconds=SCHEDULE.max_retry_delay_seconds),
    },
    tags=["streamrec"],
    doc_md=__doc__,
)
def streamrec_pass():
    @task.sensor(
        poke_interval=SCHEDULE.poke_seconds,
        timeout=SCHEDULE.wait_timeout_seconds,
        mode="poke",  # reschedule mode races the scheduler in 3.3 (apache/airflow#71172)
    )
    def wait_pass(data_interval_start: datetime | None = None) -> PokeReturnValue:
        from ops.catchup import caught_up_by
        from streamrec.passes import pass_state

        pass_id = _pass_of(data_interval_start)
        cfg = _config()
        if (by := caught_up_by(cfg, pass_id)) is not None:
            raise AirflowSkipException(
                f"pass {pass_id} was trained, with its gate decision, by the catch-up in the "
                f"run of pass {by.by_run_of}, which delivered the newest pass it trained"
            )
        state, why = pass_state(cfg.paths.data_root, pass_id)
        log.info("pass %s: %s", pass_id, why)
        if state == "never":
            raise AirflowSkipException(why)
        return PokeReturnValue(is_done=state == "complete", xcom_value=pass_id)

    @task
    def train_pass(pass_id: str) -> dict[str, Any]:
        return _client(_config()).train(pass_id).to_wire()  # XCom carries JSON

    @task
    def evaluate(train_result: dict[str, Any]) -> dict[str, Any]:
        from serving_export.delivery import evaluate
        from streamrec.contracts.training import TrainResult

        return evaluate(_config(), TrainResult.from_wire(train_result)).to_wire()

    @task
    def export(pass_id: str, decision: dict[str, Any]) -> str:
        from ops import pass_sequence
        from ops.catchup import deferred_to
        from streamrec.contracts.delivery import GateDecision

        cfg, gate = _config(), GateDecision.from_wire(decision)
        _skip_unless_passed(pass_id, gate)
        if (later := deferred_to(cfg, pass_id)) is not None:
            raise AirflowSkipException(
                f"pass {later} is complete already: this run's catch_up trains it and "
                "delivers the newest pass it trains"
            )
        return pass_sequence.export_and_publish(cfg, _client(cfg), pass_id, gate)

    @task(outlets=[SERVING_MODEL])
    def deliver(version: str, *, outlet_events=None) -> dict[str, Any]:
        return _deliver(_config(), version, outlet_events)

    # after the pass is delivered, or its export skipped: not after a failure
    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def day_end(pass_id: str) -> dict[str, Any]:
        from ops import pass_sequence

        cfg = _config()
        return pass_sequence.day_end(cfg, _client(cfg), pass_id).to_wire()

    @task
    def catch_up(pass_id: str, decision: dict[str, Any]) -> dict[str, Any]:
        from ops.catchup import catch_up
        from streamrec.contracts.delivery import GateDecision

        return catch_up(_config(), pass_id, GateDecision.from_wire(decision)).to_wire()

    # export and delivery in one task: a catch-up is rare, and one more task on this path
    # is one more scheduler loop in every run that skips it
    @task(outlets=[SERVING_MODEL])
    def deliver_newest(caught_up: dict[str, Any], *, outlet_events=None) -> dict[str, Any]:
        from ops import pass_sequence
        from serving_export.delivery import registry_for
        from streamrec.contracts.catch_up import CatchUp

        cfg = _config()
        newest = CatchUp.from_wire(caught_up)
        _skip_unless_passed(newest.pass_id, newest.decision)
        if newest.pass_id in registry_for(cfg).versions():
            raise AirflowSkipException(f"pass {newest.pass_id} was published by `export`")
        version = pass_sequence.export_and_publish(
            cfg, _client(cfg), newest.pass_id, newest.decision
        )
        return _deliver(cfg, version, outlet_events)

    @task
    def judge_online(after: str | dict[str, Any]) -> dict[str, Any]:
        from ops.online import judge_online as judge

        log.info("online metrics after pass %s", after)
        return judge(_config()).to_dict()

    @task.sensor(
        poke_interval=SCHEDULE.poke_seconds,
        timeout=SCHEDULE.wait_timeout_seconds,
        mode="poke",
    )
    def watch_pass(data_interval_start: datetime | None = None) -> PokeReturnValue:
        from ops.status import finished_status
        from streamrec.passes import pass_state

        pass_id = _pass_of(data_interval_start)
        cfg = _config()
        if (status := finished_status(cfg, pass_id)) is not None:
            log.info("pass %s: finished by the cluster's pass follower", pass_id)
            return PokeReturnValue(is_done=True, xcom_value=status.to_wire())
        state, why = pass_state(cfg.paths.data_root, pass_id)
        log.info("pass %s: %s; not finished yet", pass_id, why)
        if state == "never":
            raise AirflowSkipException(why)
        return PokeReturnValue(is_done=False)

    @task(outlets=[SERVING_MODEL])
    def delivered(status: dict[str, Any], *, outlet_events=None) -> dict[str, Any]:
        from streamrec.contracts.pass_status import PassStatus

        finished = PassStatus.from_wire(status)
        if finished.delivered is None:
            raise AirflowSkipException(f"pass {finished.pass_id} was not delivered: {status}")
        result = finished.delivered.to_wire()
        outlet_events[SERVING_MODEL].extra = result
        return result

    if CFG.cluster.follow_passes:  # the cluster drives each pass: the run watches it
        status = watch_pass()
        delivered(status)
        if CFG.served_tasks:
            judge_online(status)
        return
    pass_id = wait_pass()
    if CFG.served_tasks:  # passes cut from the served log: judged beside training
        judge_online(pass_id)
    decision = evaluate(train_pass(pass_id))
    delivered = deliver(export(pass_id, decision))
    ended = day_end(pass_id)
    delivered >> ended
    caught_up = catch_up(pass_id, decision)
    ended >> caught_up
    deliver_newest(caught_up)


streamrec_pass()
