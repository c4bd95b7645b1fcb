"""Online learning tracks the stream: on the synthetic stream the per-pass progressive AUC
reaches 0.95 of the generator's best reachable AUC within 5 passes, drops when the
generating weights drift, and is back at that level within 3 passes of the drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrec.auc import exact_auc
from streamrec.config import dump_config
from trainers.launcher import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]  # 100 s in a parallel suite

FIRST = "202611010000"
PASSES, DRIFT = 9, 5  # the generating weights are redrawn at pass index 5
LEVEL = 0.95


def test_progressive_auc_reaches_and_recovers_the_best_reachable(make_config, build_passes):
    cfg = make_config(
        join={"mode": "label_in_impression"},
        synthetic={
            "events_per_pass": 20000,
            "drift_at_pass": [DRIFT],
            "drift_fraction": 0.5,
            "cardinality": {"user_id": 2000, "item_id": 500, "category": 30, "tags": 200},
        },
    )
    batches = build_passes(cfg, FIRST, PASSES)
    passes = list(batches)[:PASSES]
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        auc = [cluster.client.train(p).test.auc for p in passes]
    best = [exact_auc(batches[p].probabilities, batches[p].labels) for p in passes]
    ratio = [a / b for a, b in zip(auc, best, strict=True)]
    print("progressive AUC", [round(a, 4) for a in auc], "best", [round(b, 4) for b in best])
    assert max(ratio[:5]) >= LEVEL, ratio  # learnt within 5 passes
    assert ratio[DRIFT] < ratio[DRIFT - 1] - 0.02, ratio  # the drift is visible
    assert max(ratio[DRIFT + 1 : DRIFT + 3]) >= LEVEL, ratio  # recovered within 3 passes
