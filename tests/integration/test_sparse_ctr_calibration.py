"""Calibration on a sparse-heavy real log, against a yardstick computed here: the KDD Cup
2012 Track 2 sample (tests/data/kdd2012_track2: 39,948 search-ad impressions, eight hashed
ids with 160,594 distinct values, most seen once or twice, plus depth and position) goes
through ``streamrec produce``, ``streamrec build-passes`` (9 passes of 4,000 rows) and
``streamrec cluster`` as shipped; each pass's progressive AUC and COPC (scored before
training on it) are compared with a logistic regression on one-hot features fitted on every
earlier pass and scored on the same pass. The rows are in no time order, so the windows are
alike and a calibrated model's COPC stays within sampling noise (about +-4%).

The replay and the regression are bench/calibration.py's (``--sample kdd2012``).

The bars are the issue's. Both sides score the same rows, so a pass's own sampling error
(about 0.5/sqrt(672 clicks) = 0.019 in AUC) is shared, not a source of failures; what
moves the gaps between runs is the training. With sparse pushes merged and batches of
64 (as shipped until issue 41; seeded), four bench replays on 2026-11-26 gave AUC gaps
0.0036-0.0064 and COPC gaps 0.0111-0.0145: the COPC bar was within that noise. With
sparse pushes unmerged and the batch that follows the pass (shipped, docs/decisions/,
"A steady model"), five gave 0.0007-0.0017 and 0.0095-0.0112. A model 0.01 AUC worse
fails: batch 512 for every pass (``min_batches_per_pass: 1``) scored AUC gaps 0.0216 and
0.0260."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from calibration import SAMPLES, replay

# alone: a young model's AUC under asynchronous training moves with how starved the
# workers are; beside the parallel suite two runs in six fell below the bar (docs/decisions/)
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(420)]

AUC_MARGIN = 0.01  # mean AUC the cluster may lose to the regression over passes 3 and later
COPC_MARGIN = 0.015  # mean |COPC - 1| it may add to the regression's over those passes
COPC_BAND = 0.12  # no scored pass's |COPC - 1| beyond this: 20-30% off is a bidder's loss


def test_new_keys_keep_the_model_calibrated_against_a_logistic_regression(make_config) -> None:
    sample = SAMPLES["kdd2012"]
    if not sample.directory.is_dir():
        pytest.fail(f"{sample.directory} is missing: tests/data/kdd2012_track2/README.md says why")
    cfg = make_config(join={"mode": "label_in_impression"}, passes={"parts_per_pass": 2})
    done = replay(cfg, sample)
    table = done.table()
    print(table)

    assert all(r.count_matches_manifest for r in done.results)
    gaps = done.gaps()
    assert gaps.auc <= AUC_MARGIN, f"AUC below the regression's by more than {AUC_MARGIN}:\n{table}"
    assert gaps.copc <= COPC_MARGIN, (
        f"mean |COPC - 1| above the regression's by more than {COPC_MARGIN}:\n{table}"
    )
    assert gaps.worst_copc <= COPC_BAND, f"a pass's COPC beyond 1 +- {COPC_BAND}:\n{table}"
