"""The quality gate: may the model trained through a pass replace the serving one?

The candidate's evidence is the pass's progressive-validation metrics (the model before
the pass, scored on data it had not seen): a conservative estimate of the candidate, which
has also trained on the pass. It passes when the pass had enough rows, every row was
evaluated (checked when the metrics are exact, i.e. with one reader thread), the AUC is at
least ``min_auc`` and not more than ``max_auc_drop`` below the serving model's own gate
AUC, and the prediction is finite. A multi-task model passes only if every head does the
same with its own bounds (``gate.tasks``, else the main task's) against the serving
model's AUC for that head; a conditional task is judged when ``gate.tasks`` names it.

With labels written before their window closes (``schema.labels[].emit``) the progressive
metrics are on labels that are not final (biased, named "fresh"): the AUC judged against
``min_auc`` and the serving model is the newest matured pass's (``TrainResult.matured``:
the model before that pass, on the final labels), and the fresh AUC is held to bounds of
its own. Until a first pass has matured the fresh AUC is held to ``min_auc`` instead of
``fresh_min_auc``: labels not yet final only lower an AUC (a late positive is trained as a
negative first), so the bound is conservative, and a cold start's untrained model
(fresh AUC about 0.5) is not delivered before anything could judge it.
"""

from __future__ import annotations

import math

from streamrec.config import GateConfig
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.training import TrainResult


def _judge_auc(
    what: str, auc: float, serving: float | None, min_auc: float, max_drop: float
) -> list[str]:
    if not math.isfinite(auc):
        return [f"{what}AUC is not finite"]
    reasons = [f"{what}AUC {auc:.4f} < min_auc {min_auc}"] if auc < min_auc else []
    if serving is not None and auc < serving - max_drop:
        reasons.append(f"{what}AUC {auc:.4f} is more than {max_drop} below serving {serving:.4f}")
    return reasons


def _judge_tasks(
    what: str,
    aucs: dict[str, float],
    serving: dict[str, float],
    gate: GateConfig,
    min_auc: float | None = None,
    max_drop: float | None = None,
) -> list[str]:
    """Each further task's AUC against its bounds (``gate.tasks``, else the main task's,
    or ``min_auc``/``max_drop`` when given) and the serving model's for that head."""
    reasons = []
    for name, auc in aucs.items():
        bounds = gate.tasks.get(name)
        low = bounds.min_auc if bounds and bounds.min_auc is not None else gate.min_auc
        drop = bounds.max_auc_drop if bounds and bounds.max_auc_drop is not None else None
        reasons += _judge_auc(
            f"{what}{name} ",
            auc,
            serving.get(name),
            low if min_auc is None else min_auc,
            (gate.max_auc_drop if drop is None else drop) if max_drop is None else max_drop,
        )
    return reasons


def judge(
    result: TrainResult, serving: GateDecision | None, gate: GateConfig, fresh: bool = False
) -> GateDecision:
    """Decide on the candidate of one pass from its train result and the serving model's
    gate decision (None when nothing serves yet). With labels written before their window
    closed (``fresh``), the AUC judged is the newest matured pass's (the true labels),
    and the progressive AUC on the labels trained with is held to ``gate.fresh_min_auc``
    (``gate.min_auc`` while no pass has matured) and ``gate.fresh_max_auc_drop``."""
    reasons = []
    if result.rows < gate.min_rows:
        reasons.append(f"rows {result.rows} < min_rows {gate.min_rows}")
    if not result.count_matches_manifest:
        reasons.append("evaluated row count differs from the pass manifest")
    if not math.isfinite(result.test.predicted_ctr):
        reasons.append("predictions are not finite")
    named = {n: t for n, t in result.tasks.items() if "|" not in n or n in gate.tasks}
    for name, task in named.items():
        if not math.isfinite(task.test.predicted_ctr):
            reasons.append(f"{name} predictions are not finite")
    progressive = {name: task.test.auc for name, task in named.items()}
    if not fresh:
        auc = result.test.auc
        serving_auc = serving.auc if serving is not None else None
        reasons += _judge_auc("", auc, serving_auc, gate.min_auc, gate.max_auc_drop)
        reasons += _judge_tasks("", progressive, serving.task_aucs if serving else {}, gate)
        return GateDecision(
            passed=not reasons,
            auc=auc,
            serving_auc=serving_auc,
            reasons=tuple(reasons),
            task_aucs=progressive,
        )
    matured = max(result.matured, key=lambda m: m.pass_id, default=None)
    auc, aucs = math.nan, {}
    serving_auc = serving.auc if serving is not None and math.isfinite(serving.auc) else None
    if matured is not None:
        main, *others = matured.tasks
        auc = matured.tasks[main].auc
        aucs = {n: matured.tasks[n].auc for n in others if n in named}
        reasons += _judge_auc("matured ", auc, serving_auc, gate.min_auc, gate.max_auc_drop)
        reasons += _judge_tasks("matured ", aucs, serving.task_aucs if serving else {}, gate)
    fresh_before = serving.fresh_auc if serving is not None else None
    fresh_min = gate.fresh_min_auc if matured is not None else max(gate.min_auc, gate.fresh_min_auc)
    reasons += _judge_auc(
        "fresh ", result.test.auc, fresh_before, fresh_min, gate.fresh_max_auc_drop
    )
    reasons += _judge_tasks(
        "fresh ",
        progressive,
        serving.fresh_task_aucs if serving else {},
        gate,
        fresh_min,
        gate.fresh_max_auc_drop,
    )
    return GateDecision(
        passed=not reasons,
        auc=auc,
        serving_auc=serving_auc,
        reasons=tuple(reasons),
        task_aucs=aucs,
        matured_pass=matured.pass_id if matured is not None else None,
        fresh_auc=result.test.auc,
        fresh_task_aucs=progressive,
    )
