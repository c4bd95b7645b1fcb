"""The quality gate: may the model trained through a pass replace the serving one?

The candidate's evidence is the pass's progressive-validation metrics (the model before
the pass, scored on data it had not seen): a conservative estimate of the candidate, which
has also trained on the pass. It passes when the pass had enough rows, every row was
evaluated (checked when the metrics are exact, i.e. with one reader thread), the AUC is at
least ``min_auc`` and not more than ``max_auc_drop`` below the serving model's own gate
AUC, and the prediction is finite. A multi-task model passes only if every head does the
same with its own bounds (``gate.tasks``, else the main task's) against the serving
model's AUC for that head; a conditional task is judged when ``gate.tasks`` names it.
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


def judge(result: TrainResult, serving: GateDecision | None, gate: GateConfig) -> GateDecision:
    """Decide on the candidate of one pass from its train result and the serving model's
    gate decision (None when nothing serves yet)."""
    auc = result.test.auc
    serving_auc = serving.auc if serving is not None else None
    reasons = []
    if result.rows < gate.min_rows:
        reasons.append(f"rows {result.rows} < min_rows {gate.min_rows}")
    if not result.count_matches_manifest:
        reasons.append("evaluated row count differs from the pass manifest")
    reasons += _judge_auc("", auc, serving_auc, gate.min_auc, gate.max_auc_drop)
    if not math.isfinite(result.test.predicted_ctr):
        reasons.append("predictions are not finite")
    task_aucs = {}
    for name, task in result.tasks.items():
        bounds = gate.tasks.get(name)
        if bounds is None and "|" in name:
            continue  # a conditional task (<task>|<given>) is judged only when named
        min_auc = bounds.min_auc if bounds and bounds.min_auc is not None else gate.min_auc
        drop = bounds.max_auc_drop if bounds and bounds.max_auc_drop is not None else None
        task_aucs[name] = task.test.auc
        before = serving.task_aucs.get(name) if serving is not None else None
        reasons += _judge_auc(
            f"{name} ", task.test.auc, before, min_auc, gate.max_auc_drop if drop is None else drop
        )
        if not math.isfinite(task.test.predicted_ctr):
            reasons.append(f"{name} predictions are not finite")
    return GateDecision(
        passed=not reasons,
        auc=auc,
        serving_auc=serving_auc,
        reasons=tuple(reasons),
        task_aucs=task_aucs,
    )
