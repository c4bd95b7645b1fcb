"""One pass's steps, written once, in the order the pipeline runs them.

    ClusterClient.train -> delivery.evaluate (the quality gate, judged once per pass)
    -> export_and_publish (the cluster's export packaged as a version and registered)
    -> delivery.deliver (the serving pointer moves) -> day_end (after a logical day's last
    pass: the cluster's shrink and daily save, then retention)

``export_and_publish`` and ``deliver`` run only for a pass its gate passed; ``day_end``
runs either way, after them, off the path from training to serving. The Airflow DAG runs
each step as its own task (``dags/streamrec_pass.py``: a step that fails is retried
alone), calling ``export_and_publish`` and ``day_end`` here and the stages' own functions
for the rest. The demo and the serving tests run a pass whole through ``run_pass``; the
catch-up takes ``day_end``, ``bench/serving.py`` and the table lifecycle test take
``export_and_publish`` (``delivery.publish`` is its second half: a raw export packaged
and registered).
Every step is idempotent per pass: a step run again returns what it did the first time.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.retention import apply
from serving_export import delivery
from streamrec.config import PipelineConfig
from streamrec.contracts.day_end import DayEnd, RetentionRun
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.training import MaintainReply, TrainResult
from trainers.control_plane import ClusterClient


@dataclass(frozen=True)
class PassOutcome:
    """What ``run_pass`` did to one pass."""

    train: TrainResult
    decision: GateDecision
    version: str | None  # delivered (a newer one may serve on); None: the gate rejected it
    day_end: DayEnd


def export_and_publish(
    cfg: PipelineConfig, client: ClusterClient, pass_id: str, decision: GateDecision
) -> str:
    """The model as trained through ``pass_id`` exported and published; its version."""
    raw = client.export(pass_id).raw_export
    return delivery.publish(cfg, raw, decision).version


def day_end(cfg: PipelineConfig, client: ClusterClient, pass_id: str) -> DayEnd:
    """After a logical day's last pass the cluster's maintenance, then retention; nothing
    after any other pass."""
    if not cfg.passes.clock.closes_day(pass_id):
        return DayEnd(
            maintain=MaintainReply(pass_id=pass_id, maintenance=False),
            retention=RetentionRun(pass_id=pass_id, retention=False),
        )
    return DayEnd(
        maintain=client.maintain(pass_id),
        retention=RetentionRun(pass_id=pass_id, retention=True, counts=apply(cfg).counts()),
    )


def run_pass(cfg: PipelineConfig, client: ClusterClient, pass_id: str) -> PassOutcome:
    """Every step for one complete pass, in order."""
    trained = client.train(pass_id)
    decision = delivery.evaluate(cfg, trained)
    version = None
    if decision.passed:
        version = delivery.deliver(cfg, export_and_publish(cfg, client, pass_id, decision)).version
    return PassOutcome(trained, decision, version, day_end(cfg, client, pass_id))
