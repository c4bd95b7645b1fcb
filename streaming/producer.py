"""Push impression events to Kafka: from a JSON-lines file or the synthetic generator.

streamrec-produce --config configs/pipeline.yaml --synthetic --passes 3 --start 202601010000
streamrec-produce --config configs/pipeline.yaml --file events.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kafka import KafkaProducer

from streaming.synthetic import SyntheticBatch, SyntheticStream
from streaming.topics import ensure_topic
from streamrec.config import EMBEDDED, PipelineConfig, load_config
from streamrec.errors import StreamrecError
from streamrec.logs import setup_logging
from streamrec.passes import next_pass_id, window_ms

log = logging.getLogger(__name__)


def make_producer(bootstrap_servers: str) -> KafkaProducer:
    """An idempotent producer (acks=all): a retried send is never written twice."""
    return KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=20, batch_size=256 * 1024)


def send_events(
    producer: KafkaProducer,
    topic: str,
    events: Iterable[dict[str, Any] | bytes],
    progress_every: int = 0,
) -> int:
    """Send events (dicts become JSON; bytes go as they are), keyed by event id; flush; count."""
    sent = 0
    start = time.monotonic()
    for event in events:
        if isinstance(event, bytes):
            producer.send(topic, value=event)
        else:
            key = str(event.get("event_id", "")).encode()
            producer.send(topic, value=json.dumps(event).encode(), key=key)
        sent += 1
        if progress_every and sent % progress_every == 0:
            rate = sent / max(time.monotonic() - start, 1e-9)
            print(f"\rproduced {sent} events ({rate:,.0f}/s)", end="", file=sys.stderr, flush=True)
    producer.flush()
    if progress_every:
        print(f"\rproduced {sent} events", file=sys.stderr)
    return sent


def synthetic_passes(
    cfg: PipelineConfig, first_pass_id: str, passes: int
) -> Iterator[tuple[str, SyntheticBatch]]:
    """One synthetic batch per pass window, then a short tail past the last window so the
    watermark closes it."""
    stream = SyntheticStream(cfg.feature_schema, cfg.synthetic)
    n = cfg.synthetic.events_per_pass
    pass_id = first_pass_id
    for _ in range(passes):
        start, end = window_ms(pass_id, cfg.passes.pass_minutes)
        yield pass_id, stream.batch(start, end, n)
        pass_id = next_pass_id(pass_id, cfg.passes.pass_minutes)
    start, _ = window_ms(pass_id, cfg.passes.pass_minutes)
    tail_end = start + 2 * (cfg.passes.allowed_lateness_seconds + 1) * 1000
    yield pass_id, stream.batch(start, tail_end, max(n // 20, 10))


def _read_jsonl(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield line.rstrip(b"\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="JSON-lines file, one event per line")
    source.add_argument("--synthetic", action="store_true", help="generate events")
    parser.add_argument("--passes", type=int, default=3, help="synthetic: pass windows to fill")
    parser.add_argument("--start", default="202601010000", help="synthetic: first pass id")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        cfg = load_config(args.config)
        if cfg.kafka.bootstrap_servers == EMBEDDED:
            parser.error("kafka.bootstrap_servers is 'embedded': give a real broker address")
        ensure_topic(cfg.kafka.bootstrap_servers, cfg.kafka.impressions_topic, cfg.kafka.partitions)
        producer = make_producer(cfg.kafka.bootstrap_servers)
        if args.file:
            events: Iterable[dict[str, Any] | bytes] = _read_jsonl(args.file)
        else:
            events = (
                e for _, b in synthetic_passes(cfg, args.start, args.passes) for e in b.events
            )
        sent = send_events(producer, cfg.kafka.impressions_topic, events, progress_every=5000)
        producer.close()
    except StreamrecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    log.info("sent %d events to %s", sent, cfg.kafka.impressions_topic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
