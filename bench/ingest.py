"""Events/s of the pass builder against a bare kafka-python consume loop on the same topic,
in the same run, on a local broker. Prints both, then ``RESULT ingest_ratio <builder/bare>``.

    .venv/bin/python bench/ingest.py [--events-per-pass 50000] [--passes 4]

Both read every message of the topic from the beginning with the same fetch settings, the
builder's isolation level (``kafka.isolation_level``, read_committed by default) and
manual partition assignment (no consumer-group join, which takes ~5 s and would be
measured for neither), after the producer's event objects are freed and collected. The
builder also validates each event, cuts windows, writes Parquet slices and assembles the
passes; the bare loop only receives the messages.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from machine import hardware_line

from devservices.kafka_broker import start_kafka
from streaming.pass_builder import PassBuilder
from streaming.producer import make_producer, messages_for, send_messages, synthetic_passes
from streaming.topics import CONSUMER_FETCH, ensure_topic
from streamrec.config import derived, load_config, with_services

REPO = Path(__file__).resolve().parent.parent


def _assigned(servers: str, topic: str, partitions: int, isolation: str) -> KafkaConsumer:
    # a group id lets the builder commit offsets; assign() never joins the group
    consumer = KafkaConsumer(
        bootstrap_servers=servers,
        group_id="bench",
        enable_auto_commit=False,
        isolation_level=isolation,
        **CONSUMER_FETCH,
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer


def produce(cfg, passes: int) -> tuple[int, str]:
    """Send the synthetic passes; (messages sent, id of the last full pass). The event dicts
    are dropped on return, so neither measurement pays for them in garbage collection."""
    producer = make_producer(cfg.kafka)
    batches = list(synthetic_passes(cfg, "202601010000", passes))
    total = sum(send_messages(producer, messages_for(cfg, b)) for _, b in batches)
    producer.close()
    return total, batches[passes - 1][0]


def bare_loop(servers: str, topic: str, partitions: int, total: int, isolation: str) -> float:
    """Seconds to receive ``total`` messages."""
    consumer = _assigned(servers, topic, partitions, isolation)
    seen, start = 0, time.perf_counter()
    while seen < total:
        seen += sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def build(cfg, root: Path, topic: str, partitions: int, last: str) -> tuple[float, int, int]:
    """Seconds for a fresh builder (empty data root) to complete every pass; passes, rows."""
    cfg = derived(cfg, "the builder's config", paths={"data_root": root})

    def consumer() -> KafkaConsumer:
        return _assigned(cfg.kafka.bootstrap_servers, topic, partitions, cfg.kafka.isolation_level)

    builder = PassBuilder(cfg, consumer_factory=consumer)
    builder.open()
    builder.acquire([TopicPartition(topic, p) for p in range(partitions)])
    gc.collect()
    start = time.perf_counter()
    done = builder.run(until_pass=last, idle_timeout_s=60)
    elapsed = time.perf_counter() - start
    builder.close()
    return elapsed, len(done), sum(m.rows for m in done)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events-per-pass", type=int, default=50_000)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=3, help="alternating runs; the median ratio counts"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        broker = start_kafka(root / "services")
        try:
            base = load_config(REPO / "configs" / "pipeline.yaml")
            cfg = derived(
                with_services(base, broker.address, "redis://unused"),
                "the ingest benchmark's config",
                join={"mode": "label_in_impression"},
                synthetic={"events_per_pass": args.events_per_pass},
            )
            topic, partitions = cfg.kafka.impressions_topic, cfg.kafka.partitions
            ensure_topic(cfg.kafka, topic, partitions)
            total, last = produce(cfg, args.passes)
            runs = []
            for i in range(args.repeat):
                gc.collect()
                isolation = cfg.kafka.isolation_level
                bare = bare_loop(broker.address, topic, partitions, total, isolation)
                built, passes, rows = build(cfg, root / f"data-{i}", topic, partitions, last)
                if passes < args.passes:
                    raise SystemExit(f"the builder completed {passes} of {args.passes} passes")
                runs.append((bare, built, rows))
        finally:
            broker.stop()
    print(f"hardware: {hardware_line()}")
    print(
        f"topic: {total:,} events in {partitions} partitions; {args.passes} passes per build; "
        f"both read {cfg.kafka.isolation_level}"
    )
    for i, (bare, built, rows) in enumerate(runs, 1):
        print(
            f"  run {i}: bare loop {bare:5.2f}s {total / bare:>9,.0f} ev/s | "
            f"builder {built:5.2f}s {total / built:>9,.0f} ev/s ({rows:,} rows) "
            f"| ratio {bare / built:.2f}"
        )
    ratios = sorted(bare / built for bare, built, _ in runs)
    print(f"RESULT ingest_ratio {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
