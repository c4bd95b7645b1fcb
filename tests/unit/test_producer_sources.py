"""Producer sources: Criteo TSV mapping and the generator's scheduled drift."""

from __future__ import annotations

import copy

import numpy as np

from streaming.events import normalize_event
from streaming.producer import criteo_events
from streaming.synthetic import SyntheticStream
from streamrec.auc import exact_auc
from streamrec.config import PipelineConfig


def test_criteo_lines_become_events_or_raw_bytes(shipped_config: PipelineConfig) -> None:
    good = "\t".join(["1", "5", "", *["0"] * 11, "68fd1e64", "", *["a9a"] * 24])
    bad = "not\ta\tcriteo\tline"
    out = list(
        criteo_events([good + "\n", bad], shipped_config.feature_schema, 1767225600000, 30.0)
    )
    event, raw = out
    assert raw == bad.encode()  # passed on as bytes: the builder dead-letters it with a reason
    row = normalize_event(event, shipped_config.feature_schema)
    assert row["label"] == 1 and row["event_time_ms"] == 1767225600000
    assert row["user_id"] == "68fd1e64"  # first categorical -> first sparse slot
    assert row["item_id"] == ""  # empty categorical -> the slot default
    assert row["price"] == np.log1p(5.0) and row["user_ctr"] == 0.0  # empty integer -> default


def test_drift_changes_the_generating_model(shipped_config: PipelineConfig) -> None:
    stream = SyntheticStream(shipped_config.feature_schema, shipped_config.synthetic)
    before = stream.batch(0, 10_000, 5_000)
    np.testing.assert_allclose(stream.probability(before.events), before.probabilities, atol=1e-4)
    old = copy.deepcopy(stream)
    stream.drift()
    after = stream.batch(10_000, 20_000, 20_000)
    best = exact_auc(after.probabilities, after.labels)
    stale = exact_auc(old.probability(after.events), after.labels)
    assert best - stale > 0.05  # a model of the old weights must re-learn
