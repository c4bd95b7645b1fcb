"""The pass builder on a real Kafka-protocol broker."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from streaming.pass_builder import PassBuilder
from streaming.producer import make_producer, send_events, synthetic_passes
from streaming.topics import ensure_topic
from streamrec.config import PipelineConfig
from streamrec.passes import complete_passes, pass_dir, read_manifest

FIRST = "202604010000"


def _produce(cfg: PipelineConfig, passes: int, extra: list[bytes] = ()) -> list[str]:
    ensure_topic(cfg.kafka, cfg.kafka.impressions_topic, cfg.kafka.partitions)
    producer = make_producer(cfg.kafka)
    ids = []
    for i, (_, batch) in enumerate(synthetic_passes(cfg, FIRST, passes)):
        send_events(producer, cfg.kafka.impressions_topic, batch.events)
        ids += [e["event_id"] for e in batch.events]
        if i == 0:
            send_events(producer, cfg.kafka.impressions_topic, list(extra))
    producer.close()
    return ids


def _event_ids_in_passes(cfg: PipelineConfig) -> list[str]:
    ids = []
    for pass_id in complete_passes(cfg.paths.data_root):
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            ids += pq.read_table(directory / part.file, columns=["event_id"])[
                "event_id"
            ].to_pylist()
    return ids


@pytest.fixture
def small_config(make_config):
    return make_config(
        synthetic={"events_per_pass": 3000},
        passes={"idle_partition_seconds": 3},
        join={"mode": "label_in_impression"},
    )


def test_passes_hold_every_event_once_and_count_malformed(small_config: PipelineConfig) -> None:
    bad = [
        b"{oops",
        json.dumps({"event_id": "no-time", "label": 1}).encode(),
        json.dumps({"event_id": "x", "event_time": 1775001600000, "label": 3}).encode(),
    ]
    produced = _produce(small_config, passes=3, extra=bad)
    builder = PassBuilder(small_config)
    try:
        manifests = builder.run(until_pass="202604010020", idle_timeout_s=30)
    finally:
        builder.close()
    assert [m.pass_id for m in manifests] == ["202604010000", "202604010010", "202604010020"]
    assert sum(m.counts.malformed_total for m in manifests) == len(bad)
    written = _event_ids_in_passes(small_config)
    in_windows = [e for e in produced if e in set(written)]
    assert len(written) == len(set(written)) == sum(m.rows for m in manifests)
    assert len(in_windows) == 3 * 3000  # every event of the three closed windows, once
    for m in manifests:
        assert m.schema_version == small_config.feature_schema.version
        assert (
            sum(r.rows for r in m.offsets[small_config.kafka.impressions_topic].values()) == m.rows
        )
        assert sum(p.rows for p in m.parts) == m.rows


def test_a_restarted_builder_resumes_without_loss_or_duplicates(
    small_config: PipelineConfig,
) -> None:
    _produce(small_config, passes=4)
    first = PassBuilder(small_config)
    try:
        assert first.run(until_pass=FIRST, idle_timeout_s=30)[0].pass_id == FIRST
    finally:
        first.close()  # stops with later windows half-read: they are not in any pass yet
    second = PassBuilder(small_config)
    try:
        later = second.run(until_pass="202604010030", idle_timeout_s=30)
    finally:
        second.close()
    assert [m.pass_id for m in later][-1] == "202604010030"
    written = _event_ids_in_passes(small_config)
    assert len(written) == len(set(written)) == 4 * 3000
    assert all(m.counts.late == 0 for m in later)
