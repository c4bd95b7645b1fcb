"""The quality gate's decisions."""

from __future__ import annotations

import math

from serving_export.quality_gate import judge
from streamrec.config import GateConfig

GATE = GateConfig(min_auc=0.6, max_auc_drop=0.02, min_rows=100)


def _result(auc: float, rows: int = 1000, matches: bool = True, ctr: float = 0.2) -> dict:
    return {
        "pass_id": "202601010000",
        "rows": rows,
        "count_matches_manifest": matches,
        "test": {"auc": auc, "predicted_ctr": ctr},
    }


def test_passes_a_good_first_model() -> None:
    d = judge(_result(0.7), None, GATE)
    assert d.passed and d.reasons == [] and d.serving_auc is None


def test_rejects_each_failure_with_a_reason() -> None:
    assert "min_auc" in judge(_result(0.55), None, GATE).reasons[0]
    assert "below serving" in judge(_result(0.70), {"auc": 0.75}, GATE).reasons[0]
    assert judge(_result(0.74), {"auc": 0.75}, GATE).passed  # within max_auc_drop
    assert "min_rows" in judge(_result(0.9, rows=10), None, GATE).reasons[0]
    assert "row count" in judge(_result(0.9, matches=False), None, GATE).reasons[0]
    assert "not finite" in judge(_result(math.nan), None, GATE).reasons[0]
    assert "predictions" in judge(_result(0.9, ctr=math.nan), None, GATE).reasons[0]
