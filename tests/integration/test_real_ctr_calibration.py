"""Calibration on real impressions, against a yardstick computed here: the Criteo
Attribution Modeling sample (tests/data/criteo_attribution, 165,152 rows in time order)
goes through ``streamrec produce``, ``streamrec build-passes`` (16 passes of 10,000 rows)
and ``streamrec cluster`` as shipped; each pass's progressive AUC and COPC (scored before
training on it) are compared with a logistic regression on one-hot features fitted on every
earlier pass and scored on the same pass. The stream's own click rate drifts (0.34-0.39 a
pass), so a band on COPC alone would test the data; the regression meets the same drift.

The replay and the regression are bench/calibration.py's (one copy for the benchmark, which
also varies workers, sync mode and the intercept refit, and for this test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from calibration import SAMPLES, replay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

AUC_MARGIN = 0.01  # mean AUC the cluster may lose to the regression over passes 4 and later
COPC_MARGIN = 0.015  # mean |COPC - 1| it may add to the regression's over those passes


def test_progressive_auc_and_copc_keep_up_with_a_logistic_regression(make_config) -> None:
    sample = SAMPLES["criteo_attribution"]
    if not sample.directory.is_dir():
        pytest.fail(
            f"{sample.directory} is missing: tests/data/criteo_attribution/README.md says why"
        )
    cfg = make_config(join={"mode": "label_in_impression"}, passes={"parts_per_pass": 2})
    done = replay(cfg, sample)
    table = done.table()
    print(table)

    assert all(r.count_matches_manifest for r in done.results)
    assert all(r.intercept and r.intercept.shift != 0 for r in done.results), "refit never ran"
    gaps = done.gaps()
    assert gaps.auc <= AUC_MARGIN, f"AUC below the regression's by more than {AUC_MARGIN}:\n{table}"
    assert gaps.copc <= COPC_MARGIN, (
        f"mean |COPC - 1| above the regression's by more than {COPC_MARGIN}:\n{table}"
    )
