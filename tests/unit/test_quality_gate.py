"""The quality gate's decisions."""

from __future__ import annotations

import math

import pytest

from serving_export.quality_gate import judge
from streamrec.config import GateConfig
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.training import MaturedMetrics, TaskResult, TrainResult
from streamrec.errors import ContractError
from trainers.metrics import PassMetrics

GATE = GateConfig(min_auc=0.6, max_auc_drop=0.02, min_rows=100)


def _metrics(auc: float, ctr: float) -> PassMetrics:
    return PassMetrics(1000, auc, 0.45, 1.0, 0.3, 0.4, 0.2, ctr, 0.01)


def _result(
    auc: float,
    rows: int = 1000,
    matches: bool = True,
    ctr: float = 0.2,
    tasks: dict[str, float] | None = None,
) -> TrainResult:
    return TrainResult(
        tasks={
            name: TaskResult(test=_metrics(x, ctr), train=_metrics(0.8, ctr))
            for name, x in (tasks or {}).items()
        },
        pass_id="202601010000",
        rows=rows,
        count_matches_manifest=matches,
        test=_metrics(auc, ctr),
        train=_metrics(0.8, 0.2),
        seconds={},
        workers=2,
        reader="QueueDataset",
        progressive="sample",
        progressive_every=1,
        sync_mode="async",
        sync_rounds=None,
        dense_average=None,
        intercept=None,
        started_at=0.0,
        trained_at=1.0,
    )


def _serving(auc: float, **task_aucs: float) -> GateDecision:
    return GateDecision(passed=True, auc=auc, serving_auc=None, task_aucs=task_aucs)


def test_passes_a_good_first_model() -> None:
    d = judge(_result(0.7), None, GATE)
    assert d.passed and d.reasons == () and d.serving_auc is None


def test_rejects_each_failure_with_a_reason() -> None:
    assert "min_auc" in judge(_result(0.55), None, GATE).reasons[0]
    assert "below serving" in judge(_result(0.70), _serving(0.75), GATE).reasons[0]
    assert judge(_result(0.74), _serving(0.75), GATE).passed  # within max_auc_drop
    assert "min_rows" in judge(_result(0.9, rows=10), None, GATE).reasons[0]
    assert "row count" in judge(_result(0.9, matches=False), None, GATE).reasons[0]
    assert "not finite" in judge(_result(math.nan), None, GATE).reasons[0]
    assert "predictions" in judge(_result(0.9, ctr=math.nan), None, GATE).reasons[0]


def test_a_train_result_missing_or_renaming_a_field_fails_at_the_boundary() -> None:
    """A renamed key must not read as a model that measured nothing ("AUC is not finite")."""
    reply = _result(0.7).to_wire()
    assert TrainResult.from_wire(reply) == _result(0.7)  # NaN-free: equal after the trip
    reply["progressive_auc"] = reply.pop("test")
    with pytest.raises(ContractError, match="test") as failed:
        TrainResult.from_wire(reply, "train 202601010000")
    assert "202601010000" in str(failed.value) and "TrainResult" in str(failed.value)


def test_each_head_is_judged_with_its_own_bounds_against_its_serving_auc() -> None:
    gate = GateConfig(
        min_auc=0.6,
        max_auc_drop=0.02,
        min_rows=100,
        tasks={"conversion": {"min_auc": 0.7, "max_auc_drop": 0.05}},
    )
    both = {"conversion": 0.75, "conversion|click": 0.55}
    d = judge(_result(0.8, tasks=both), None, gate)
    assert d.passed and d.task_aucs == {"conversion": 0.75}  # a conditional only when named
    low = judge(_result(0.8, tasks={"conversion": 0.65}), None, gate)
    assert low.reasons == ("conversion AUC 0.6500 < min_auc 0.7",)
    # against the serving version's own AUC for that head, with the head's own drop
    assert judge(
        _result(0.8, tasks={"conversion": 0.76}), _serving(0.8, conversion=0.8), gate
    ).passed
    dropped = judge(_result(0.8, tasks={"conversion": 0.74}), _serving(0.8, conversion=0.8), gate)
    assert dropped.reasons == ("conversion AUC 0.7400 is more than 0.05 below serving 0.8000",)
    # a conditional task named in gate.tasks is judged; a head without bounds takes the main's
    named = GateConfig(min_auc=0.6, max_auc_drop=0.02, min_rows=100, tasks={"conversion|click": {}})
    d = judge(_result(0.8, tasks=both), None, named)
    assert d.reasons == ("conversion|click AUC 0.5500 < min_auc 0.6",)
    assert d.task_aucs == both


def _fresh(fresh_auc: float, matured: dict[str, float] | None, **tasks: float) -> TrainResult:
    result = _result(fresh_auc, tasks=tasks)
    judged = []
    if matured is not None:
        judged = [
            MaturedMetrics(
                pass_id="202601000000",
                judged_in=result.pass_id,
                tasks={n: _metrics(a, 0.2) for n, a in matured.items()},
            )
        ]
    return result.model_copy(update={"matured": judged})


def test_fresh_labels_are_judged_on_the_newest_matured_pass_and_fresh_bounds() -> None:
    # the biased fresh AUC is low, the matured one good: delivered, judged on the matured
    d = judge(_fresh(0.55, {"click": 0.7}), None, GATE, fresh=True)
    assert d.passed and d.auc == 0.7 and d.fresh_auc == 0.55 and d.matured_pass == "202601000000"
    # a matured AUC below min_auc, or a fresh one below its own bound, rejects
    assert (
        "matured AUC 0.5500 < min_auc"
        in judge(_fresh(0.6, {"click": 0.55}), None, GATE, True).reasons[0]
    )
    assert (
        "fresh AUC 0.4000 < min_auc 0.5"
        in judge(_fresh(0.4, {"click": 0.7}), None, GATE, True).reasons[0]
    )
    # against the serving model: matured with matured, fresh with fresh
    serving = judge(_fresh(0.62, {"click": 0.72}), None, GATE, fresh=True)
    assert (
        "matured AUC 0.6900 is more than 0.02 below serving 0.7200"
        in judge(_fresh(0.62, {"click": 0.69}), serving, GATE, True).reasons
    )
    assert (
        "fresh AUC 0.5500 is more than 0.05 below serving 0.6200"
        in judge(_fresh(0.55, {"click": 0.72}), serving, GATE, True).reasons
    )
    # before any pass matured the fresh AUC is held to min_auc: a cold start's untrained
    # model is not delivered; a further head's matured AUC is judged too
    early = judge(_fresh(0.6, None), None, GATE, fresh=True)
    assert early.passed and math.isnan(early.auc) and early.matured_pass is None
    cold = judge(_fresh(0.52, None), None, GATE, fresh=True)
    assert cold.reasons == ("fresh AUC 0.5200 < min_auc 0.6",)
    assert judge(_fresh(0.52, {"click": 0.7}), None, GATE, fresh=True).passed
    d = judge(_fresh(0.6, {"click": 0.7, "conversion": 0.5}, conversion=0.6), early, GATE, True)
    assert d.reasons == ("matured conversion AUC 0.5000 < min_auc 0.6",)
