"""A three-broker Apache Kafka under the pipeline, losing a broker while passes flow.

Three KRaft nodes (each a broker and a controller) on three hosts made from network
namespaces (``hosts.Network``); every topic at replication 3 with ``min.insync.replicas``
2, the producers idempotent with ``acks=all``. ``streamrec produce --live`` sends a stream
timed now and ``streamrec build-passes`` cuts it into 20-second passes. Two faults land
where they cost most, a few seconds before a window closes:

1. the broker leading the impressions topic's first partition is SIGKILLed, and started
   again on its own storage 15 s later;
2. the broker leading a partition then (another one) has its link cut for longer than
   the brokers' session timeout (9 s), then plugged back.

Nobody restarts the producer or the builder. After it: every event the producer sent is
in the topic once, every event of a complete window is in exactly one pass, nothing was
dead-lettered, and each fault's freshness cost (how much later than the unfaulted pass its
pass was written) is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hosts import Network, can_make_hosts
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from devservices.kafka_broker import KafkaNode, restart_kafka_node, start_kafka_cluster
from devservices.processes import RunningService
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import complete_passes, pass_dir, read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CLI = str(Path(sys.executable).with_name("streamrec"))
WINDOW_S = 20  # each fault in its own window (the killed broker is back before the cut)
LATENESS_S = 5
RATE = 150  # impressions per second
BEFORE_CLOSE_S = 5  # each fault starts this long before a window ends
KILLED_FOR_S = 15
CUT_FOR_S = 25  # longer than broker.session.timeout.ms (9 s): the controller fences it


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    if reason := can_make_hosts():
        pytest.skip(reason)
    with Network(["k1", "k2", "k3"]) as net:
        yield net


def _sleep_until(wall_s: float) -> None:
    time.sleep(max(0.0, wall_s - time.time()))


def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> the node id leading it, as the cluster's metadata says now."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        (described,) = admin.describe_topics([topic])
    finally:
        admin.close()
    return {p["partition_index"]: p["leader_id"] for p in described["partitions"]}


def _records(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed record of ``topic`` (none if it does not exist), read by assignment
    up to each partition's end."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not partitions:
            return []
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        values: list[bytes] = []
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            for records in consumer.poll(timeout_ms=1000).values():
                values += [m.value for m in records]
        return values
    finally:
        consumer.close()


def _pass_rows(cfg: PipelineConfig) -> Counter[str]:
    """How many times each event id is in a complete pass."""
    seen: Counter[str] = Counter()
    for pass_id in complete_passes(cfg.paths.data_root):
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            seen.update(pq.read_table(directory / part.file, columns=["event_id"])[0].to_pylist())
    return seen


def _freshness_s(cfg: PipelineConfig, pass_id: str) -> float:
    """Seconds from the window's end to the pass being written."""
    manifest = read_manifest(pass_dir(cfg.paths.data_root, pass_id))
    created = datetime.fromisoformat(manifest.created_at).timestamp()
    return created - manifest.window_end_ms / 1000


def _wait_for_pass(cfg: PipelineConfig, pass_id: str, builder: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while pass_id not in complete_passes(cfg.paths.data_root):
        assert builder.poll() is None, "the pass builder exited"
        assert time.monotonic() < deadline, f"pass {pass_id} was never completed"
        time.sleep(0.5)


def test_a_broker_killed_and_one_cut_off_lose_and_repeat_nothing(
    network: Network, make_config, tmp_path: Path
) -> None:
    hosts = list(network.hosts.values())
    nodes = [KafkaNode(h.address, (9092, 9093), tuple(h.command([]))) for h in hosts]
    logs = tmp_path / "kafka"
    brokers: list[RunningService] = start_kafka_cluster(logs, nodes)
    bootstrap = ",".join(n.address for n in nodes)
    cfg = derived(
        make_config(),
        "the three-broker test",
        kafka={"bootstrap_servers": bootstrap, "partitions": 3},
        join={"mode": "label_in_impression"},
        passes={"pass_seconds": WINDOW_S, "allowed_lateness_seconds": LATENESS_S},
    )
    config = dump_config(cfg, tmp_path / "pipeline.yaml")
    out = tmp_path / "logs"
    out.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start(name: str, *args: str) -> subprocess.Popen:
        with open(out / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                [CLI, *args, "--config", str(config)], stdout=log, stderr=log, env=env
            )

    t0 = time.time()
    # the first window has 20 s of events at least
    first_close = (int(t0 + 20) // WINDOW_S + 1) * WINDOW_S
    kill_at = first_close + WINDOW_S - BEFORE_CLOSE_S
    cut_at = first_close + 2 * WINDOW_S - BEFORE_CLOSE_S  # the killed broker is back by then
    producer = start("produce", "produce", "--live", "--rate", str(RATE),
                     "--duration", str(cut_at + BEFORE_CLOSE_S + 40 - t0))  # fmt: skip
    builder = start("build", "build-passes")
    faults: dict[str, tuple[float, str]] = {}
    try:
        _sleep_until(kill_at)
        leader = _leaders(bootstrap, cfg.kafka.impressions_topic)[0]
        brokers[leader - 1].process.send_signal(signal.SIGKILL)
        faults["leader SIGKILL"] = (kill_at, hosts[leader - 1].name)
        time.sleep(KILLED_FOR_S)
        brokers[leader - 1] = restart_kafka_node(logs, leader, nodes)

        _sleep_until(cut_at)
        led = set(_leaders(bootstrap, cfg.kafka.impressions_topic).values())
        cut = min(led - {leader})  # a broker leading a partition now, not the killed one
        hosts[cut - 1].cut()
        faults["broker cut off"] = (cut_at, hosts[cut - 1].name)
        time.sleep(CUT_FOR_S)
        hosts[cut - 1].plug()

        assert producer.wait(timeout=180) == 0, (out / "produce.log").read_text()[-3000:]
        closes = [first_close + WINDOW_S * i for i in range(3)]
        passes = [cfg.passes.clock.id_at(int((c - WINDOW_S) * 1000)) for c in closes]
        _wait_for_pass(cfg, passes[-1], builder)
        events = [json.loads(v) for v in _records(bootstrap, cfg.kafka.impressions_topic)]
        dead = _records(bootstrap, cfg.kafka.impressions_topic + cfg.kafka.dlq_suffix)
    finally:
        builder.send_signal(signal.SIGTERM)
        builder.wait(timeout=60)
        producer.kill()
        for broker in brokers:
            broker.stop()

    topic = [(e["event_id"], int(e["event_time"])) for e in events]
    sent = int((out / "produce.log").read_text().rsplit("sent ", 1)[1].split()[0])
    repeated = [e for e, n in Counter(e for e, _ in topic).items() if n > 1]
    assert not repeated, f"{len(repeated)} events are in the topic twice: {repeated[:5]}"
    assert len(topic) == sent, (len(topic), sent)
    in_passes = _pass_rows(cfg)
    assert not [e for e, n in in_passes.items() if n > 1], "an event is in two passes"
    expected = {e for e, t in topic if t < closes[-1] * 1000}
    missing = expected - set(in_passes)
    assert not missing, f"{len(missing)} of {len(expected)} events are in no pass"
    assert not dead, f"{len(dead)} events were dead-lettered"

    freshness = {p: _freshness_s(cfg, p) for p in passes}
    baseline = freshness[passes[0]]
    print(f"{len(expected)} events in {len(passes)} passes; freshness {freshness}")
    for (name, (at, host)), pass_id in zip(faults.items(), passes[1:], strict=True):
        cost = freshness[pass_id] - baseline
        print(f"{name} on {host} at {at - t0:.0f}s: pass {pass_id} written {cost:+.1f}s later")
