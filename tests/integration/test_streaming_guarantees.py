"""Streaming guarantees on the real broker: exactly once under SIGKILL and rebalances, the
click join against the generator's ground truth, and hostile input."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from kafka import KafkaConsumer, TopicPartition

from streaming.errors import MalformedEvent
from streaming.events import parse_event
from streaming.pass_builder import PassBuilder
from streaming.producer import make_producer, produce_synthetic, send_messages, synthetic_passes
from streaming.topics import ensure_topic
from streamrec.config import PipelineConfig, dump_config
from streamrec.passes import PassClock, complete_passes, pass_dir, read_manifest, slices_root

pytestmark = pytest.mark.slow

FIRST = "202605010000"


def _config(make_config, **sections) -> PipelineConfig:
    base = {
        "synthetic": {"events_per_pass": 3000, "click_delay_seconds": 30},
        "passes": {
            "idle_partition_seconds": 3,
            "parts_per_pass": 2,
            "allowed_lateness_seconds": 10,
        },
        "join": {"mode": "click_join", "label_window_seconds": 60},
        "kafka": {"session_timeout_ms": 6000},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return make_config(**base)


def _rows(cfg: PipelineConfig) -> dict[str, tuple[str, int]]:
    """event_id -> (pass id, label) over every complete pass; asserts no event repeats."""
    seen: dict[str, tuple[str, int]] = {}
    for pass_id in complete_passes(cfg.paths.data_root):
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            table = pq.read_table(directory / part.file, columns=["event_id", "label"])
            for event_id, label in zip(
                table["event_id"].to_pylist(), table["label"].to_pylist(), strict=True
            ):
                assert event_id not in seen, f"{event_id} is in {seen[event_id][0]} and {pass_id}"
                seen[event_id] = (pass_id, label)
    return seen


def _expected(cfg: PipelineConfig, batches: dict, passes: int) -> dict[str, int]:
    window = cfg.join.label_window_seconds * 1000
    return {
        e["event_id"]: int(label)
        for batch in list(batches.values())[:passes]
        for e, label in zip(batch.events, batch.labels_within(window), strict=True)
    }


def _last_pass(passes: int) -> str:
    last = FIRST
    for _ in range(passes - 1):
        last = PassClock(600).next(last)
    return last


def _builder(config_path: Path, until: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streaming.pass_builder",
            "--config",
            str(config_path),
            "--until-pass",
            until,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _slice_count(cfg: PipelineConfig) -> int:
    return len(list(slices_root(cfg.paths.data_root).glob("*/*/p*/_SUCCESS")))


def _writing(cfg: PipelineConfig) -> bool:
    root = Path(cfg.paths.data_root)
    return any(root.glob("slices/*/*/.p*.tmp-*")) or any(root.glob("passes/*/.*.tmp-*"))


def test_click_join_labels_match_the_generator(make_config) -> None:
    cfg = _config(make_config)
    batches = produce_synthetic(cfg, FIRST, 3)
    builder = PassBuilder(cfg)
    try:
        done = builder.run(until_pass=_last_pass(3), idle_timeout_s=60)
    finally:
        builder.close()
    rows = _rows(cfg)
    expected = _expected(cfg, batches, 3)
    assert {e: label for e, (_, label) in rows.items()} == expected
    clicks_late = sum(
        int(b.labels.sum() - b.labels_within(60_000).sum()) for b in list(batches.values())[:3]
    )
    assert clicks_late > 0  # the stream has clicks after the window ...
    # ... and every one is counted, none labels a row: late while its impression was pending,
    # or unmatched when it came after the impression's window was already cut
    counted = sum(m.counts.label_total("late") + m.counts.label_total("unmatched") for m in done)
    assert counted == clicks_late
    assert all(m.counts.label_total("duplicate") == 0 for m in done)
    for m in done:  # both topics' offsets are in every manifest, per partition
        assert set(m.offsets) == {cfg.kafka.impressions_topic, cfg.join.clicks_topic}
        clicks = m.offsets[cfg.join.clicks_topic]
        assert sum(r.rows for r in clicks.values()) >= m.positives


def test_sigkilled_builder_writes_every_event_exactly_once(make_config, tmp_path: Path) -> None:
    cfg = _config(make_config, synthetic={"events_per_pass": 6000})
    passes = 6
    batches = produce_synthetic(cfg, FIRST, passes)
    config_path = dump_config(cfg, tmp_path / "cfg.yaml")
    rng = random.Random(7)
    kills, deadline = 0, time.monotonic() + 400
    while not pass_dir(cfg.paths.data_root, _last_pass(passes)).joinpath("_SUCCESS").exists():
        assert time.monotonic() < deadline, "the builder did not finish"
        proc = _builder(config_path, _last_pass(passes))
        if kills < 6:
            target = _slice_count(cfg) + rng.randint(0, 2)
            mid_write = rng.random() < 0.5
            while proc.poll() is None and not (
                _slice_count(cfg) >= target and (not mid_write or _writing(cfg))
            ):
                time.sleep(0.002)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        proc.wait(timeout=300)
    assert kills >= 5
    # _rows asserts that no event appears twice across passes
    got = {e: label for e, (_, label) in _rows(cfg).items()}
    assert got == _expected(cfg, batches, passes)


def test_two_builders_in_a_group_with_one_killed(make_config, tmp_path: Path) -> None:
    cfg = _config(make_config, synthetic={"events_per_pass": 6000})
    passes = 5
    batches = produce_synthetic(cfg, FIRST, passes)
    config_path = dump_config(cfg, tmp_path / "cfg.yaml")
    last = _last_pass(passes)
    a, b = _builder(config_path, last), _builder(config_path, last)
    deadline = time.monotonic() + 120
    while _slice_count(cfg) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    a.send_signal(signal.SIGKILL)  # b takes over a's partition after the session timeout
    a.wait()
    assert b.wait(timeout=300) == 0, b.stderr.read().decode()[-2000:]
    got = {e: label for e, (_, label) in _rows(cfg).items()}
    assert got == _expected(cfg, batches, passes)
    manifests = [
        read_manifest(pass_dir(cfg.paths.data_root, p))
        for p in complete_passes(cfg.paths.data_root)
    ]
    assert all(m.partitions == cfg.kafka.partitions for m in manifests)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)
WRONG_TYPES = st.fixed_dictionaries(
    {
        "event_id": st.one_of(st.text(max_size=200), st.integers(), st.just("\ud800")),
        "event_time": st.one_of(st.integers(min_value=-5, max_value=2**64), st.text(max_size=3)),
        "sparse": st.dictionaries(
            st.sampled_from(["user_id", "tags", "x"]),
            st.one_of(st.text(max_size=5), st.lists(st.integers(), max_size=3), st.floats()),
        ),
        "dense": st.dictionaries(
            st.sampled_from(["price", "user_ctr"]), st.one_of(st.floats(), st.text(max_size=3))
        ),
    }
)
WELL_FORMED_ODD = st.fixed_dictionaries(  # valid shape, hostile times and values
    {
        "event_id": st.text(min_size=1, max_size=30).map(lambda s: "h-" + s),
        "event_time": st.one_of(
            st.integers(min_value=1, max_value=2**62 - 1),
            st.sampled_from([1, 1777593600000, 4102444800000]),
        ),
        "label": st.sampled_from([0, 1]),
        "sparse": st.dictionaries(st.sampled_from(["user_id", "item_id"]), st.text(max_size=50)),
        "dense": st.dictionaries(
            st.sampled_from(["price"]), st.floats(allow_nan=False, allow_infinity=False)
        ),
    }
)
HOSTILE = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=100).map(str.encode),
    JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    WRONG_TYPES.map(lambda d: json.dumps(d, allow_nan=True).encode()),
    WELL_FORMED_ODD.map(lambda d: json.dumps(d).encode()),
)


def _rejected(cfg: PipelineConfig, raw: bytes) -> bool:
    """Whether the builder must dead-letter ``raw`` (bad content, or a future timestamp)."""
    try:
        row = parse_event(raw, cfg.feature_schema, cfg.kafka.max_message_bytes)
    except MalformedEvent:
        return True
    return row["event_time_ms"] > (time.time() + cfg.passes.max_future_seconds) * 1000


ANCIENT_AND_FUTURE = [
    b'{"event_id": "h-1970", "event_time": 1, "label": 1}',  # accepted: its own pass
    b'{"event_id": "h-2100", "event_time": 4102444800000, "label": 0}',  # future_time
    b'{"event_id": "h-nan", "event_time": 5, "label": 0, "dense": {"price": NaN}}',
    b"\xff{",
    b"[" * 3000,
]


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(bad=st.lists(HOSTILE, min_size=5, max_size=40))
@example(bad=ANCIENT_AND_FUTURE)
def test_hostile_events_never_crash_the_builder(make_config, bad: list[bytes]) -> None:
    """Every rejected event is in the DLQ with a reason and its source; every good event is
    in a pass; accepted odd events (ancient or extreme times) do not stop passes closing."""
    cfg = _config(
        make_config, join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 500}
    )
    ensure_topic(cfg.kafka, cfg.kafka.impressions_topic, 1)
    producer = make_producer(cfg.kafka)
    batches = dict(synthetic_passes(cfg, FIRST, 2))
    first, *rest = batches.values()
    topic = cfg.kafka.impressions_topic
    send_messages(producer, [(topic, e) for e in first.events])
    send_messages(producer, [(topic, raw) for raw in bad])
    for batch in rest:
        send_messages(producer, [(topic, e) for e in batch.events])
    producer.close()
    builder = PassBuilder(cfg)
    try:
        done = builder.run(until_pass=_last_pass(2), idle_timeout_s=60)
    finally:
        builder.close()
    assert {FIRST, _last_pass(2)} <= {m.pass_id for m in done}
    good = {e["event_id"] for b in list(batches.values())[:2] for e in b.events}
    assert set(_rows(cfg)) >= good
    consumer = KafkaConsumer(
        bootstrap_servers=cfg.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    consumer.assign([TopicPartition(topic + cfg.kafka.dlq_suffix, 0)])
    dead = list(consumer)
    consumer.close()
    rejected = [raw for raw in bad if _rejected(cfg, raw)]
    assert sorted(m.value for m in dead) == sorted(rejected)
    assert all(dict(m.headers)["reason"] for m in dead)
    assert all(dict(m.headers)["source"].startswith(topic.encode()) for m in dead)
    assert sum(m.counts.malformed_total for m in done) == len(rejected)
