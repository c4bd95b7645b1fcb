"""The synthetic stream: valid events, reproducible, with a known best AUC."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streaming.events import normalize_event
from streaming.synthetic import SyntheticStream
from streamrec.config import PipelineConfig, derived, load_config
from streamrec.errors import ConfigError
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


CONVERSIONS = Path(__file__).resolve().parents[2] / "examples" / "conversions" / "pipeline.yaml"


def _conversions(n: int = 40_000, bias: float | None = None):
    cfg = load_config(CONVERSIONS)
    if bias is not None:
        cfg = derived(cfg, "another bias", synthetic={"conversion": {"bias": bias}})
    return cfg, SyntheticStream(cfg.feature_schema, cfg.synthetic).batch(0, 600_000, n)


def test_conversions_follow_their_model_after_their_clicks() -> None:
    cfg, batch = _conversions()
    converted = batch.conversion_times >= 0
    clicked = batch.labels == 1
    assert not (converted & ~clicked).any()  # only a click converts
    assert (batch.conversion_times[converted] > batch.click_times[converted]).all()
    # conversions among the clicked follow p(conversion | click): their count is within five
    # standard errors of its expectation (a Poisson-binomial sum), and the same draw is far
    # outside five of them for a model 0.5 off in its bias
    p = batch.conversion_probabilities[clicked]
    se = np.sqrt((p * (1 - p)).sum())
    assert abs(converted.sum() - p.sum()) < 5 * se
    _, shifted = _conversions(bias=cfg.synthetic.conversion.bias + 0.5)
    q = shifted.conversion_probabilities[clicked]
    assert abs(converted.sum() - q.sum()) > 5 * np.sqrt((q * (1 - q)).sum())
    # the delay is log-normal: half within its median, a tail past the hour's window
    lags = (batch.conversion_times - batch.click_times)[converted] / 1000
    median = cfg.synthetic.conversion.delay_median_seconds
    share = (lags <= median).mean()
    assert abs(share - 0.5) < 5 * np.sqrt(0.25 / converted.sum())
    assert 0.05 < (lags > 3600).mean() < 0.2


def test_each_task_has_a_best_reachable_auc_and_the_builders_labels() -> None:
    cfg, batch = _conversions()
    expected = batch.expected_labels(cfg.labels)
    click, conversion = expected["click"], expected["conversion"]
    assert not (conversion & ~click).any()  # unattributed conversions are dropped
    converted = batch.conversion_times >= 0
    assert 0 < conversion.sum() < converted.sum()  # some came after their window
    ctr = exact_auc(batch.probabilities, click)
    ctcvr = exact_auc(batch.probabilities * batch.conversion_probabilities, conversion)
    cvr = exact_auc(batch.conversion_probabilities[click == 1], conversion[click == 1])
    assert all(0.65 < auc < 0.95 for auc in (ctr, ctcvr, cvr)), (ctr, ctcvr, cvr)
    # impressions carry no joined label; the producer sends each to its topic at its time
    from streaming.producer import messages_for

    messages = messages_for(cfg, batch)
    by_topic = Counter(topic for topic, _ in messages)
    assert by_topic == {
        "impressions": len(batch.events),
        "clicks": int((batch.click_times >= 0).sum()),
        "conversions": int(converted.sum()),
    }
    impression = next(e for t, e in messages if t == "impressions")
    assert "label" not in impression and "label_conversion" not in impression


def test_the_producer_sends_every_topic_in_event_time_order_across_passes() -> None:
    """A conversion hours after its impression is sent among the events of its own time,
    not with its impression's pass: the builder's watermark takes a topic's newest event
    time as how far it has read (a pass's conversions sent with the pass ran that topic
    hours ahead, and a builder restarted behind on it cut windows without them)."""
    from streaming.producer import merged_messages, messages_for

    cfg = load_config(CONVERSIONS)
    stream = SyntheticStream(cfg.feature_schema, cfg.synthetic)
    batches = [stream.batch(i * 600_000, (i + 1) * 600_000, 2_000) for i in range(4)]
    keys = {"impressions": "event_time", "clicks": "click_time", "conversions": "conversion_time"}

    def times(messages: list) -> dict[str, list[int]]:
        by_topic: dict[str, list[int]] = {}
        for topic, event in messages:
            by_topic.setdefault(topic, []).append(event[keys[topic]])
        return by_topic

    merged = list(merged_messages(cfg, batches))
    assert Counter(t for t, _ in merged) == Counter(
        t for b in batches for t, _ in messages_for(cfg, b)
    )
    assert all(t == sorted(t) for t in times(merged).values())
    by_pass = times([m for b in batches for m in messages_for(cfg, b)])["conversions"]
    assert by_pass != sorted(by_pass)  # what the merge is for: pass by pass, out of order


def test_a_conversion_label_needs_the_conversion_process(shipped_config: PipelineConfig) -> None:
    cfg = load_config(CONVERSIONS)
    bare = derived(cfg, "no process", synthetic={"conversion": None})
    with pytest.raises(ConfigError, match=r"synthetic\.conversion is not set"):
        SyntheticStream(bare.feature_schema, bare.synthetic)


def test_a_drifting_stream_moves_its_weights_at_its_half_life(
    shipped_config: PipelineConfig,
) -> None:
    """With drift_half_life_minutes the generating weights decay towards fresh ones in
    event time: after one half-life their correlation with where they stood is 0.5 (within
    five standard errors, about 5/sqrt(n) over n weights), their spread unchanged, and the
    old model's probabilities rank the new labels worse than the new ones do."""
    cfg = derived(shipped_config, "drift", synthetic={"drift_half_life_minutes": 30})
    stream = SyntheticStream(cfg.feature_schema, cfg.synthetic)
    t0 = 1_767_225_600_000
    stream.advance(t0)
    before = np.concatenate([w.copy() for w in stream._weights.values()])
    old = stream.batch(t0, t0 + 60_000, 20_000)
    stream.advance(t0 + 30 * 60_000)
    after = np.concatenate(list(stream._weights.values()))
    assert abs(np.corrcoef(before, after)[0, 1] - 0.5) < 5 / np.sqrt(len(before))
    assert abs(after.std() / before.std() - 1) < 0.1
    new = stream.batch(t0 + 30 * 60_000, t0 + 31 * 60_000, 20_000)
    stale = SyntheticStream(cfg.feature_schema, cfg.synthetic)  # stands where it began
    stale.advance(t0)
    gap = exact_auc(new.probabilities, new.labels) - exact_auc(
        stale.probability(new.events), new.labels
    )
    assert gap > 0.02, gap
    assert exact_auc(old.probabilities, old.labels) > 0.6
    # without drift the weights never move
    steady = SyntheticStream(shipped_config.feature_schema, shipped_config.synthetic)
    weights = np.concatenate([w.copy() for w in steady._weights.values()])
    steady.advance(t0)
    steady.advance(t0 + 10**9)
    assert np.array_equal(weights, np.concatenate(list(steady._weights.values())))
