"""The pass builder's metrics from its snapshot: names and units as Prometheus expects them
(counters with ``_total``, the watermark in epoch seconds), a label per topic, partition,
reason and label, and no sample where a figure is not known (pure logic on hand-made
snapshots; ``tests/integration/test_prometheus.py`` scrapes a running builder)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streaming.builder_metrics import (
    BuilderCollector,
    BuilderSnapshot,
    PartitionFigures,
    TopicPartitionFigures,
)

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(snapshot: BuilderSnapshot | None) -> Scrape:
    registry = CollectorRegistry()
    registry.register(BuilderCollector("p1", lambda: snapshot))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (f"streamrec_{name}", tuple(sorted({"pipeline": "p1", **labels}.items())))


SNAPSHOT = BuilderSnapshot(
    topic_partitions=(
        TopicPartitionFigures("imps", 0, 120, 3.5, 10_000, {"bad_json": 2, "future_time": 1}),
        TopicPartitionFigures("imps", 1, 0, 0.0, 9_000),
        TopicPartitionFigures("clicks", 0, None, None, 0),  # nothing known of its end yet
    ),
    partitions=(
        PartitionFigures(0, 1_700_000_000_500, 40, {"click": 7}),
        PartitionFigures(1, None, 0, {}),  # nothing seen yet
    ),
    passes_assembled=3,
)


def test_each_partitions_lag_watermark_and_waiting_rows_are_served() -> None:
    got = _scrape(SNAPSHOT)
    assert got[_key("builder_consumer_lag_records", topic="imps", partition="0")] == 120
    assert got[_key("builder_consumer_lag_seconds", topic="imps", partition="0")] == 3.5
    assert got[_key("builder_consumer_lag_seconds", topic="imps", partition="1")] == 0
    assert got[_key("builder_watermark_timestamp_seconds", partition="0")] == 1_700_000_000.5
    assert got[_key("builder_waiting_rows", partition="0")] == 40
    assert got[_key("builder_waiting_rows", partition="1")] == 0
    assert got[_key("builder_open_label_rows", partition="0", label="click")] == 7


def test_counts_are_counters_with_their_reason() -> None:
    got = _scrape(SNAPSHOT)
    dead = {k: v for k, v in got.items() if k[0] == "streamrec_builder_dead_letters_total"}
    assert dead == {
        _key("builder_dead_letters_total", topic="imps", partition="0", reason="bad_json"): 2,
        _key("builder_dead_letters_total", topic="imps", partition="0", reason="future_time"): 1,
    }
    assert got[_key("builder_records_read_total", topic="imps", partition="1")] == 9_000
    assert got[_key("builder_passes_assembled_total")] == 3


def test_a_figure_not_known_is_no_sample() -> None:
    got = _scrape(SNAPSHOT)
    assert _key("builder_consumer_lag_records", topic="clicks", partition="0") not in got
    assert _key("builder_consumer_lag_seconds", topic="clicks", partition="0") not in got
    assert _key("builder_watermark_timestamp_seconds", partition="1") not in got
    assert _scrape(None) == {}  # before the first snapshot: nothing at all
