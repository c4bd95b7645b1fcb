"""The synthetic stream: valid events, reproducible, with a known best AUC."""

from __future__ import annotations

import numpy as np

from streaming.events import normalize_event
from streaming.synthetic import SyntheticStream
from streamrec.config import PipelineConfig
from trainers.metrics import exact_auc


def test_events_are_valid_and_time_ordered(shipped_config: PipelineConfig) -> None:
    batch = SyntheticStream(shipped_config.feature_schema, shipped_config.synthetic).batch(
        0, 600_000, 500
    )
    rows = [normalize_event(e, shipped_config.feature_schema) for e in batch.events]
    times = [r["event_time_ms"] for r in rows]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 600_000
    assert len({e["event_id"] for e in batch.events}) == 500
    assert batch.labels.tolist() == [r["label"] for r in rows]


def test_reproducible_and_informative(shipped_config: PipelineConfig) -> None:
    a = SyntheticStream(shipped_config.feature_schema, shipped_config.synthetic).batch(
        0, 1000, 20_000
    )
    b = SyntheticStream(shipped_config.feature_schema, shipped_config.synthetic).batch(
        0, 1000, 20_000
    )
    assert a.events[:50] == b.events[:50]
    assert np.array_equal(a.probabilities, b.probabilities)
    best = exact_auc(a.probabilities, a.labels)
    assert 0.75 < best < 0.95
    assert abs(a.labels.mean() - a.probabilities.mean()) < 0.02  # labels follow the model
