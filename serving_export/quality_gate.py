"""The quality gate: may the model trained through a pass replace the serving one?

The candidate's evidence is the pass's progressive-validation metrics (the model before
the pass, scored on data it had not seen): a conservative estimate of the candidate, which
has also trained on the pass. It passes when the pass had enough rows, every row was
evaluated (checked when the metrics are exact, i.e. with one reader thread), the AUC is at
least ``min_auc`` and not more than ``max_auc_drop`` below the serving model's own gate
AUC, and the prediction is finite.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from streamrec.config import GateConfig
from trainers.results import TrainResult


@dataclass(frozen=True)
class GateDecision:
    """Whether to deliver, and why not."""

    passed: bool
    auc: float
    serving_auc: float | None
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(result: TrainResult, serving_auc: float | None, gate: GateConfig) -> GateDecision:
    """Decide on the candidate of one pass from its train result and the serving model's
    gate AUC (None when nothing serves yet)."""
    auc = result.test.auc
    reasons = []
    if result.rows < gate.min_rows:
        reasons.append(f"rows {result.rows} < min_rows {gate.min_rows}")
    if not result.count_matches_manifest:
        reasons.append("evaluated row count differs from the pass manifest")
    if not math.isfinite(auc):
        reasons.append("AUC is not finite")
    elif auc < gate.min_auc:
        reasons.append(f"AUC {auc:.4f} < min_auc {gate.min_auc}")
    if serving_auc is not None and math.isfinite(auc) and auc < serving_auc - gate.max_auc_drop:
        reasons.append(
            f"AUC {auc:.4f} is more than {gate.max_auc_drop} below serving {serving_auc:.4f}"
        )
    if not math.isfinite(result.test.predicted_ctr):
        reasons.append("predictions are not finite")
    return GateDecision(not reasons, auc, serving_auc, reasons)
