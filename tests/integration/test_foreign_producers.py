"""What producer teams send, read by the pass builder: librdkafka (``confluent-kafka``, the
stand-in for the Java and Go clients) with every codec, keys, headers, idempotence, record
timestamps and transactions, and our own producer with every codec; through the builder
class and through ``streamrec build-passes``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer

from streaming.pass_builder import PassBuilder
from streaming.producer import make_producer, send_events
from streaming.topics import ensure_topic
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import (
    PassClock,
    complete_passes,
    is_complete,
    pass_dir,
    read_holds,
    read_manifest,
)

START_MS = 1767225600000  # 2026-01-01 00:00 UTC: pass 202601010000
W0, W1, W2 = "202601010000", "202601010010", "202601010020"
MINUTE = 60_000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
STREAMREC = str(Path(sys.executable).with_name("streamrec"))
DISORDER_S = 21 * 60  # the codec test: how late an event can come behind a later one


def _pass_of(event_ms: int) -> str:
    return PassClock(600).id_at(event_ms)  # the shipped pass_seconds


def _event(event_id: str, event_ms: int | None) -> bytes:
    event: dict[str, Any] = {"event_id": event_id, "label": len(event_id) % 2}
    if event_ms is not None:
        event["event_time"] = event_ms
    event["sparse"] = {"user_id": f"u{len(event_id)}", "tags": ["a", "b"]}
    return json.dumps(event).encode()


def _delivered(err: Any, msg: Any) -> None:
    """A librdkafka delivery report: a record the broker did not take fails the test (from
    the flush that reports it) instead of going missing from the passes."""
    if err is not None:
        raise AssertionError(f"not delivered to {msg.topic()}/{msg.partition()}: {err}")


def _librdkafka(bootstrap: str, **settings: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",  # where the Java client puts a key
            "linger.ms": 5,
            "on_delivery": _delivered,
            **settings,
        }
    )


def _rows(cfg: PipelineConfig) -> dict[str, list[str]]:
    """Event ids of every complete pass, by pass id."""
    rows = {}
    for pass_id in complete_passes(cfg.paths.data_root):
        directory = pass_dir(cfg.paths.data_root, pass_id)
        rows[pass_id] = [
            event_id
            for part in read_manifest(directory).parts
            for event_id in pq.read_table(directory / part.file)["event_id"].to_pylist()
        ]
    return rows


def _dead_letters(cfg: PipelineConfig) -> list[Any]:
    consumer = KafkaConsumer(
        cfg.kafka.impressions_topic + cfg.kafka.dlq_suffix,
        bootstrap_servers=cfg.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    try:
        return list(consumer)
    finally:
        consumer.close()


def _build_with_cli(cfg: PipelineConfig, until: str, timeout_s: float = 120) -> None:
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    done = subprocess.run(
        [
            *(STREAMREC, "build-passes", "--config", str(config)),
            *("--until-pass", until, "--idle-timeout", "60"),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _build_with_class(cfg: PipelineConfig, until: str) -> None:
    builder = PassBuilder(cfg)
    try:
        builder.run(until_pass=until, idle_timeout_s=60)
    finally:
        builder.close()


def _close_windows(bootstrap: str, cfg: PipelineConfig, at_ms: int) -> None:
    """One event on every partition at ``at_ms``: each partition's watermark passes it."""
    producer = _librdkafka(bootstrap, **{"enable.idempotence": True})
    for partition in range(cfg.kafka.partitions):
        producer.produce(
            cfg.kafka.impressions_topic,
            value=_event(f"tail-{at_ms}-{partition}", at_ms),
            partition=partition,
        )
    assert producer.flush(30) == 0


def _send_ours(cfg: PipelineConfig, events: list[dict[str, Any]], runner: str) -> None:
    """Our producer with the config's ``kafka.compression``: ``streamrec produce --file``, or
    the function it calls."""
    if runner == "class":
        producer = make_producer(cfg.kafka)
        send_events(producer, cfg.kafka.impressions_topic, events)
        producer.close()
        return
    name = f"ours-{cfg.kafka.compression}"
    events_file = Path(cfg.paths.work_root) / f"{name}.jsonl"
    events_file.parent.mkdir(parents=True, exist_ok=True)
    events_file.write_text("".join(json.dumps(e) + "\n" for e in events))
    config = dump_config(cfg, Path(cfg.paths.work_root) / f"{name}.yaml")
    done = subprocess.run(
        [STREAMREC, "produce", "--config", str(config), "--file", str(events_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("runner", ["class", "cli"])
def test_every_codec_from_librdkafka_and_ours_lands_in_exactly_one_pass(
    make_config, services, runner: str
) -> None:
    # each producer's events span both windows, one producer after another: the topic's
    # disorder is 20 minutes, which the allowed lateness must cover (a broker hands them out
    # in fetches, and W0 must not close while a later producer's W0 events are unread)
    cfg = make_config(
        join={"mode": "label_in_impression"},
        kafka={"missing_event_time": "record_timestamp"},
        passes={"idle_partition_seconds": 2, "allowed_lateness_seconds": DISORDER_S},
    )
    ensure_topic(cfg.kafka, cfg.kafka.impressions_topic, cfg.kafka.partitions)
    expected: dict[str, str] = {}  # event id -> the pass it belongs in
    for codec in CODECS:
        producer = _librdkafka(
            services.bootstrap_servers, **{"compression.type": codec, "enable.idempotence": True}
        )
        for i in range(120):
            event_id = f"rd-{codec}-{i}"
            event_ms = START_MS + (i % 20) * MINUTE + i  # windows W0 and W1
            untimed = i % 6 == 0  # no event_time: the record's timestamp times it
            producer.produce(
                cfg.kafka.impressions_topic,
                key=event_id.encode(),
                value=_event(event_id, None if untimed else event_ms),
                headers=[("codec", codec.encode()), ("trace-id", f"t{i}".encode())],
                timestamp=event_ms,
            )
            expected[event_id] = W0 if event_ms < START_MS + 10 * MINUTE else W1
        assert producer.flush(30) == 0
        events = [
            {"event_id": f"ours-{codec}-{i}", "event_time": START_MS + i * MINUTE, "label": 1}
            for i in range(20)
        ]
        _send_ours(
            derived(cfg, f"the config with {codec}", kafka={"compression": codec}),
            events,
            runner,
        )
        expected |= {e["event_id"]: W0 if i < 10 else W1 for i, e in enumerate(events)}
    _close_windows(services.bootstrap_servers, cfg, START_MS + 21 * MINUTE + DISORDER_S * 1000)

    (_build_with_cli if runner == "cli" else _build_with_class)(cfg, W1)

    rows = _rows(cfg)
    found = {event_id: pass_id for pass_id in (W0, W1) for event_id in rows[pass_id]}
    counts = Counter(event_id for pass_id in (W0, W1) for event_id in rows[pass_id])
    assert [e for e, n in counts.items() if n > 1] == []
    assert found == expected  # each in the pass of its event time (or record timestamp)
    assert _dead_letters(cfg) == []


def test_a_missing_codec_stops_the_builder_with_exit_3_naming_it(
    make_config, services, tmp_path: Path
) -> None:
    cfg = make_config(join={"mode": "label_in_impression"})
    ensure_topic(cfg.kafka, cfg.kafka.impressions_topic, cfg.kafka.partitions)
    producer = _librdkafka(services.bootstrap_servers, **{"compression.type": "zstd"})
    producer.produce(cfg.kafka.impressions_topic, value=_event("z-1", START_MS))
    assert producer.flush(30) == 0
    hidden = tmp_path / "hide-zstandard" / "zstandard"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    env = {**os.environ, "PYTHONPATH": str(hidden.parent)}
    done = subprocess.run(
        [STREAMREC, "build-passes", "--config", str(config), "--idle-timeout", "30"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 3, done.stderr[-3000:]
    assert "zstd codec" in done.stderr and "pip install zstandard" in done.stderr
    assert "Traceback" not in done.stderr


def _wait(what: str, check: Any, timeout_s: float = 60, builder: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if builder is not None and builder.poll() is not None:
            pytest.fail(f"the builder exited ({builder.returncode}) waiting for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def _wait_for_hold(root: Path, partition: int, pass_id: str, builder: Any) -> None:
    """Until the builder's only note says ``partition`` holds window ``pass_id``."""
    _wait(
        f"the hold of {pass_id} on partition {partition}",
        lambda: [(h.partition, h.pass_id) for h in read_holds(root)] == [(partition, pass_id)],
        builder=builder,
    )


def test_transactions_commit_abort_and_an_open_one_holds_its_window(make_config) -> None:
    """On Apache Kafka, which hands read_committed readers no aborted record, through
    ``streamrec build-passes`` and ``streamrec status``: passes hold exactly the committed
    events, a producer's commit right after its own abort included, and a window behind an
    open transaction completes only once it is committed (or aborted)."""
    cfg = make_config(
        join={"mode": "label_in_impression"},
        passes={"idle_partition_seconds": 2, "allowed_lateness_seconds": 30},
    )
    topic, root = cfg.kafka.impressions_topic, cfg.paths.data_root
    ensure_topic(cfg.kafka, topic, cfg.kafka.partitions)
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    # one transactional producer commits and aborts in turn: its commit right after its own
    # abort is what noida-db, the stand-in broker before, lost (docs/decisions/)
    bootstrap = cfg.kafka.bootstrap_servers
    txn = _librdkafka(bootstrap, **{"transactional.id": f"{cfg.name}-txn"})
    txn.init_transactions(30)
    plain = _librdkafka(bootstrap, **{"enable.idempotence": True, "compression.type": "lz4"})
    committed: dict[str, str] = {}

    def transaction(tag: str, window_ms: int, partition: int) -> None:
        """Begin a transaction and send 40 events in it; its caller ends it."""
        txn.begin_transaction()
        for i in range(40):
            event_id = f"{tag}-{i}"
            txn.produce(
                topic, key=event_id, value=_event(event_id, window_ms + i), partition=partition
            )
        assert txn.flush(30) == 0

    def later_events(tag: str, window_ms: int) -> None:
        for partition in range(cfg.kafka.partitions):
            for i in range(30):
                event_id = f"{tag}-p{partition}-{i}"
                plain.produce(
                    topic, value=_event(event_id, window_ms + i * 2000), partition=partition
                )
                committed[event_id] = _pass_of(window_ms)
        assert plain.flush(30) == 0

    builder = subprocess.Popen(
        [STREAMREC, "build-passes", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for partition in range(cfg.kafka.partitions):
            transaction(f"ab{partition}", START_MS + 2 * MINUTE, partition)
            txn.abort_transaction(30)
            transaction(f"c{partition}", START_MS + MINUTE, partition)
            txn.commit_transaction(30)
            committed |= {f"c{partition}-{i}": W0 for i in range(40)}
        # left open on partition 0 while later events arrive on both partitions
        transaction("open-commit", START_MS + 3 * MINUTE, 0)
        later_events("w1", START_MS + 10 * MINUTE)
        later_events("w2", START_MS + 20 * MINUTE)
        _wait_for_hold(root, 0, W0, builder)
        time.sleep(5)  # well past the idle time: partition 1's progress closes nothing
        assert not is_complete(pass_dir(root, W0))
        status = subprocess.run(
            [STREAMREC, "status", "--config", str(config)], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stderr
        held = [line for line in status.stdout.splitlines() if line.startswith(W0)]
        assert held and f"held: a transaction open on {topic}/0" in held[0], status.stdout

        txn.commit_transaction(30)
        committed |= {f"open-commit-{i}": W0 for i in range(40)}
        _wait("W0 and W1", lambda: is_complete(pass_dir(root, W1)), builder=builder)
        _wait("the hold's release", lambda: read_holds(root) == [], builder=builder)

        # the same on partition 1, ended by an abort this time
        transaction("open-abort", START_MS + 22 * MINUTE, 1)
        later_events("w3", START_MS + 30 * MINUTE)
        later_events("w4", START_MS + 40 * MINUTE)
        _wait_for_hold(root, 1, W2, builder)
        assert not is_complete(pass_dir(root, W2))
        txn.abort_transaction(30)
        w3 = pass_dir(root, _pass_of(START_MS + 30 * MINUTE))
        _wait("W2 and W3", lambda: is_complete(w3), builder=builder)
    finally:
        builder.send_signal(signal.SIGTERM)
        _, stderr = builder.communicate(timeout=60)
    assert builder.returncode == 130, stderr[-3000:]  # stopped as on Ctrl-C

    rows = _rows(cfg)
    found = Counter(event_id for ids in rows.values() for event_id in ids)
    assert [e for e, n in found.items() if n > 1] == []
    aborted = [e for e in found if e.startswith(("ab", "open-abort"))]
    assert aborted == []
    complete = set(rows)
    assert {e: p for p, ids in rows.items() for e in ids} == {
        e: p for e, p in committed.items() if p in complete
    }
    assert {W0, W1, W2} <= complete
