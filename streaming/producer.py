"""Push events to Kafka: from a JSON-lines or Criteo-style TSV file, or from the generator
(passes of past windows, or a live stream timed now).

    streamrec produce --config my.yaml --synthetic --passes 3 --start 202601010000 --rate 5000
    streamrec produce --config my.yaml --live --rate 200          # timed now, until Ctrl-C
    streamrec produce --config my.yaml --file events.jsonl
    streamrec produce --config my.yaml --file day_0.tsv --format criteo

The generator's impressions carry the labels whose source is the impression; each label
joined from its own topic (the clicks in ``click_join`` mode, the conversions) is sent there
when it happens. A Criteo line is
``label <tab> 13 integers <tab> 26 categorical``; integers fill the schema's dense features
and categoricals its sparse slots, in order, and event times are spread evenly over passes.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import io
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaProducer

from streaming.deliveries import Deliveries
from streaming.kafka_clients import producer_settings
from streaming.synthetic import SyntheticBatch, SyntheticStream, record_best_auc
from streaming.topics import ensure_topic
from streamrec.auc import exact_auc
from streamrec.config import (
    EMBEDDED,
    KafkaConfig,
    PipelineConfig,
    SchemaConfig,
    load_config,
)
from streamrec.entry import run_command

log = logging.getLogger(__name__)

Message = tuple[str, dict[str, Any] | bytes]  # (topic, event dict or raw bytes)
CRITEO_DENSE, CRITEO_SPARSE = 13, 26


def make_producer(kafka: KafkaConfig) -> KafkaProducer:
    """An idempotent producer (acks=all): a retried send is never written twice. Batches
    are compressed with ``kafka.compression``."""
    return KafkaProducer(**producer_settings(kafka), linger_ms=20, batch_size=256 * 1024)


def send_events(
    producer: KafkaProducer,
    topic: str,
    events: Iterable[dict[str, Any] | bytes],
    progress_every: int = 0,
    rate: float | None = None,
) -> int:
    """Send events to one topic (see ``send_messages``)."""
    return send_messages(producer, ((topic, e) for e in events), progress_every, rate)


def send_messages(
    producer: KafkaProducer,
    messages: Iterable[Message],
    progress_every: int = 0,
    rate: float | None = None,
) -> int:
    """Send messages keyed by event id (dicts become JSON; bytes go as they are), at most
    ``rate`` per second, with a progress line every ``progress_every``; flush; count.
    Raises ``KafkaUnavailable`` if Kafka did not take some of them."""
    sent = 0
    deliveries = Deliveries()
    start = time.monotonic()
    for topic, event in messages:
        _send(producer, topic, event, deliveries)
        sent += 1
        if rate:
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        if progress_every and sent % progress_every == 0:
            speed = sent / max(time.monotonic() - start, 1e-9)
            print(
                f"\rproduced {sent:,} events ({speed:,.0f}/s)", end="", file=sys.stderr, flush=True
            )
    producer.flush()
    if progress_every:
        print(f"\rproduced {sent:,} events in {time.monotonic() - start:.1f}s", file=sys.stderr)
    deliveries.check()
    return sent


def synthetic_passes(
    cfg: PipelineConfig, first_pass_id: str, passes: int
) -> Iterator[tuple[str, SyntheticBatch]]:
    """One synthetic batch per pass window (drifting where configured), then a tail past
    the last window long enough for the watermark (and the label window) to close it."""
    stream = SyntheticStream(cfg.feature_schema, cfg.synthetic)
    n = cfg.synthetic.events_per_pass
    clock = cfg.passes.clock
    pass_id = clock.id_at(clock.window(first_pass_id)[0])  # as the clock spells it
    for index in range(passes):
        if index in cfg.synthetic.drift_at_pass:
            stream.drift()
        start, end = clock.window(pass_id)
        yield pass_id, stream.batch(start, end, n)
        pass_id = clock.next(pass_id)
    start, _ = clock.window(pass_id)
    label_wait = cfg.label_wait_seconds
    tail_end = start + 2 * (cfg.passes.allowed_lateness_seconds + label_wait + 1) * 1000
    yield pass_id, stream.batch(start, tail_end, max(n // 20, 10))


def messages_for(cfg: PipelineConfig, batch: SyntheticBatch) -> list[Message]:
    """The messages one batch becomes under the configured labels: impressions carry the
    labels whose source is the impression, each joined label's events go to its topic.
    Label events are logged when they happen, so everything is sent merged in event-time
    order, as a live stream would deliver it (across batches: ``merged_messages``)."""
    return [(topic, event) for _, topic, event in _timed(cfg, batch)]


def merged_messages(cfg: PipelineConfig, batches: Iterable[SyntheticBatch]) -> Iterator[Message]:
    """The messages of consecutive batches in event-time order across them: a label event
    later than the next batch's first impression (a conversion hours after its click) is
    sent among that batch's events, as a live stream would, not with its impression's
    batch. Each topic is then in event-time order, which the builder's watermark counts
    on; only the label events still to come are held between batches."""
    waiting: list[tuple[int, int, str, dict[str, Any]]] = []  # (time, seq, topic, event)
    seq = 0
    for batch in batches:
        timed = _timed(cfg, batch)
        start = timed[0][0] if timed else None
        while waiting and (start is None or waiting[0][0] < start):
            _, _, topic, event = heapq.heappop(waiting)
            yield topic, event
        for time_ms, topic, event in timed:
            seq += 1
            heapq.heappush(waiting, (time_ms, seq, topic, event))
    while waiting:
        _, _, topic, event = heapq.heappop(waiting)
        yield topic, event


def _timed(cfg: PipelineConfig, batch: SyntheticBatch) -> list[tuple[int, str, dict[str, Any]]]:
    """A batch's messages as (event time, topic, event), in event-time order (stable: an
    impression before a label event of the same millisecond)."""
    if not cfg.topic_labels:
        return [(e["event_time"], cfg.kafka.impressions_topic, e) for e in batch.events]
    dropped = {x.event_fields[0] for x in cfg.topic_labels}
    timed: list[tuple[int, str | None, dict[str, Any]]] = [
        (
            e["event_time"],
            cfg.kafka.impressions_topic,
            {k: v for k, v in e.items() if k not in dropped},
        )
        for e in batch.events
    ]
    for label in cfg.topic_labels:
        timed += [(x[label.time_key], label.topic, x) for x in batch.label_events(label.name)]
    timed.sort(key=lambda m: m[0])
    return [(t, str(topic), event) for t, topic, event in timed]


def ensure_event_topics(cfg: PipelineConfig) -> None:
    """Create the impressions topic and each joined label's topic."""
    topics = [cfg.kafka.impressions_topic, *(x.topic for x in cfg.topic_labels if x.topic)]
    for topic in topics:
        ensure_topic(cfg.kafka, topic, cfg.kafka.partitions)


def produce_synthetic(
    cfg: PipelineConfig, first_pass_id: str, passes: int
) -> dict[str, SyntheticBatch]:
    """Create the config's topics (each joined label's too) and send ``passes``
    synthetic passes from ``first_pass_id`` to them, plus the tail that closes the last;
    the batches by pass id."""
    ensure_event_topics(cfg)
    producer = make_producer(cfg.kafka)
    try:
        batches = dict(synthetic_passes(cfg, first_pass_id, passes))
        send_messages(producer, merged_messages(cfg, batches.values()))
    finally:
        producer.close()
    done = list(batches.items())[:passes]
    record_best_auc(
        cfg.paths.data_root,
        {p: best_auc(cfg, b) for p, b in done},
        {p: tasks for p, b in done if (tasks := b.best_task_aucs(cfg.labels))},
    )
    return batches


def best_auc(cfg: PipelineConfig, batch: SyntheticBatch) -> float:
    """The AUC of the generating click probabilities on the click labels the pipeline will
    see."""
    click = next((x for x in cfg.labels if x.name == "click"), None)
    labels = batch.expected_labels([click])["click"] if click else batch.labels
    return exact_auc(batch.probabilities, labels)


def produce_live(
    cfg: PipelineConfig,
    rate: float,
    stop: threading.Event,
    tick_s: float = 0.5,
    progress_every_s: float = 0,
    sent_times: dict[str, list[np.ndarray]] | None = None,
    label_times: dict[str, list[np.ndarray]] | None = None,
) -> int:
    """A live synthetic stream until ``stop`` is set: impressions timed now, ``rate`` per
    second, each click sent when its time comes; each closed window's best reachable AUC is
    recorded for reports. Returns the impressions sent; ``sent_times`` (if given) gets the
    event times (epoch ms) of the impressions sent in each window (pass id -> an array per
    send) as they are sent, and ``label_times`` (if given) each joined label's events that
    come within its window, as (impression time, event time) rows (label -> arrays), as
    they are drawn. Raises ``KafkaUnavailable`` if Kafka did not take some of them."""
    ensure_event_topics(cfg)
    # A run-specific id prefix: a restarted live producer must not reuse event ids.
    stream = SyntheticStream(cfg.feature_schema, cfg.synthetic, id_prefix=f"live{int(time.time())}")
    producer = make_producer(cfg.kafka)
    deliveries = Deliveries()
    later: list[tuple[int, int, str, dict[str, Any]]] = []  # (time, seq, topic, event) heap
    windows: dict[str, list[SyntheticBatch]] = {}
    label_ms, clock = cfg.label_wait_seconds * 1000, cfg.passes.clock
    time_key = {x.topic: x.time_key for x in cfg.topic_labels}
    arrivals = np.random.default_rng(cfg.synthetic.seed + 2)  # Poisson arrivals per tick
    sent = seq = 0
    last_ms = int(time.time() * 1000)
    started = next_report = time.monotonic()
    try:
        while not stop.wait(tick_s):
            # never straddle a window: each batch belongs to one pass (for its best AUC)
            window = clock.id_at(last_ms)
            boundary = clock.window(window)[1]
            now_ms = min(int(time.time() * 1000), boundary)
            n = int(arrivals.poisson(rate * (now_ms - last_ms) / 1000))
            if n:
                batch = stream.batch(last_ms, now_ms, n)
                windows.setdefault(window, []).append(batch)
                for _, topic, event in _timed(cfg, batch):
                    if topic == cfg.kafka.impressions_topic:
                        _send(producer, topic, event, deliveries)
                    else:
                        seq += 1
                        heapq.heappush(later, (event[time_key[topic]], seq, topic, event))
                sent += n
                if sent_times is not None or label_times is not None:
                    times = np.fromiter((e["event_time"] for e in batch.events), np.int64, n)
                    if sent_times is not None:
                        sent_times.setdefault(window, []).append(times)
                    if label_times is not None:
                        _record_label_times(cfg, batch, times, label_times)
            while later and later[0][0] <= now_ms:
                _, _, topic, event = heapq.heappop(later)
                _send(producer, topic, event, deliveries)
            last_ms = now_ms
            closed = [p for p in windows if clock.window(p)[1] + label_ms < now_ms]
            if closed:
                ended = {p: _concat(windows.pop(p)) for p in closed}
                record_best_auc(
                    cfg.paths.data_root,
                    {p: best_auc(cfg, b) for p, b in ended.items()},
                    {p: t for p, b in ended.items() if (t := b.best_task_aucs(cfg.labels))},
                )
            if progress_every_s and time.monotonic() >= next_report:
                next_report += progress_every_s
                log.info(
                    "live stream: %d impressions in %.0fs, %d label events pending",
                    sent,
                    time.monotonic() - started,
                    len(later),
                )
    finally:
        producer.flush()
        producer.close()
    deliveries.check()
    return sent


def _record_label_times(
    cfg: PipelineConfig,
    batch: SyntheticBatch,
    times: np.ndarray,
    label_times: dict[str, list[np.ndarray]],
) -> None:
    """Each joined label's events in ``batch`` that come within the label's window of their
    impression (``times``), as (impression time, label event time) rows."""
    for label in cfg.topic_labels:
        happened = batch.times_of(label.name)
        within = (happened >= 0) & (happened - times <= (label.window_seconds or 0) * 1000)
        pairs = np.stack([times[within], happened[within]], axis=1)
        label_times.setdefault(label.name, []).append(pairs)


def _send(
    producer: KafkaProducer,
    topic: str,
    event: dict[str, Any] | bytes,
    deliveries: Deliveries,
) -> None:
    """One message: raw bytes as they are, an event as JSON keyed by its event id."""
    if isinstance(event, bytes):
        deliveries.watch(producer.send(topic, value=event))
    else:
        key = str(event.get("event_id", "")).encode()
        deliveries.watch(producer.send(topic, value=json.dumps(event).encode(), key=key))


def _concat(batches: list[SyntheticBatch]) -> SyntheticBatch:
    return SyntheticBatch(
        [e for b in batches for e in b.events],
        np.concatenate([b.probabilities for b in batches]),
        np.concatenate([b.labels for b in batches]),
        np.concatenate([b.click_times for b in batches]),
        np.concatenate([b.conversion_probabilities for b in batches]),
        np.concatenate([b.conversion_times for b in batches]),
    )


def criteo_events(
    lines: Iterable[str], schema: SchemaConfig, start_ms: int, spacing_ms: float
) -> Iterator[dict[str, Any] | bytes]:
    """Events from Criteo TSV lines; a line that does not parse is passed on as raw bytes,
    so the builder dead-letters it with a reason instead of the producer dropping it."""
    for i, line in enumerate(lines):
        cols = line.rstrip("\n").split("\t")
        if len(cols) != 1 + CRITEO_DENSE + CRITEO_SPARSE or cols[0] not in ("0", "1"):
            yield line.encode()
            continue
        ints, cats = cols[1 : 1 + CRITEO_DENSE], cols[1 + CRITEO_DENSE :]
        try:
            dense = {
                d.name: math.log1p(max(float(v), 0.0)) if v else d.default
                for d, v in zip(schema.dense, ints, strict=False)
            }
        except ValueError:
            yield line.encode()
            continue
        yield {
            "event_id": f"criteo-{i}",
            "event_time": int(start_ms + i * spacing_ms),
            "sparse": {s.name: v for s, v in zip(schema.sparse, cats, strict=False) if v},
            "dense": dense,
            "label": int(cols[0]),
        }


def _open(path: Path) -> io.BufferedIOBase:
    """``path``, gunzipped on the fly when it ends in ``.gz``."""
    return gzip.GzipFile(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _text_lines(path: Path) -> Iterator[str]:
    with _open(path) as f:
        for line in f:
            yield line.decode("utf-8", errors="replace")


def _jsonl(path: Path) -> Iterator[bytes]:
    with _open(path) as f:
        for line in f:
            if line.strip():
                yield line.rstrip(b"\n")


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the CLI reference is generated from them)."""
    parser = argparse.ArgumentParser(
        prog="streamrec produce",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--file", type=Path, help="events file (JSON lines or Criteo TSV; .gz is read too)"
    )
    source.add_argument("--synthetic", action="store_true", help="generate events")
    source.add_argument(
        "--live",
        action="store_true",
        help="a live synthetic stream timed now, at --rate events/s, until Ctrl-C or --duration",
    )
    parser.add_argument("--duration", type=float, help="--live: stop after this many seconds")
    parser.add_argument(
        "--format", choices=["jsonl", "criteo"], default="jsonl", help="--file format"
    )
    parser.add_argument("--passes", type=int, default=3, help="pass windows to fill")
    parser.add_argument("--start", default="202601010000", help="pass id of the first window")
    parser.add_argument("--rate", type=float, help="events per second at most")
    return parser


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    # a live stream stops at Ctrl-C or SIGTERM by itself, between two sends
    stop = threading.Event() if args.live else None
    return run_command(lambda: _produce(cli, args, stop), stop)


def _produce(
    parser: argparse.ArgumentParser, args: argparse.Namespace, stop: threading.Event | None
) -> int:
    cfg = load_config(args.config)
    if cfg.kafka.bootstrap_servers == EMBEDDED:
        parser.error("kafka.bootstrap_servers is 'embedded': give a real broker address")
    if stop is not None:
        return _live(cfg, args.rate or 100.0, args.duration, stop)
    ensure_event_topics(cfg)
    producer = make_producer(cfg.kafka)
    topic = cfg.kafka.impressions_topic
    messages: Iterable[Message]
    if args.file and args.format == "jsonl":
        messages = ((topic, raw) for raw in _jsonl(args.file))
    elif args.file:
        start, _ = cfg.passes.clock.window(args.start)
        spacing = cfg.passes.clock.width_ms / cfg.synthetic.events_per_pass
        lines = _text_lines(args.file)
        messages = ((topic, e) for e in criteo_events(lines, cfg.feature_schema, start, spacing))
    else:
        messages = _synthetic_messages(cfg, args.start, args.passes)
    sent = send_messages(producer, messages, progress_every=5000, rate=args.rate)
    producer.close()
    log.info("sent %d messages", sent)
    return 0


def _live(cfg: PipelineConfig, rate: float, duration: float | None, stop: threading.Event) -> int:
    if duration is not None:
        timer = threading.Timer(duration, stop.set)
        timer.daemon = True
        timer.start()
    sent = produce_live(cfg, rate, stop, progress_every_s=10)
    log.info("sent %d live impressions", sent)
    return 0


def _synthetic_messages(cfg: PipelineConfig, start: str, passes: int) -> Iterator[Message]:
    """The passes' messages in event-time order (``merged_messages``); each pass's best
    reachable AUCs are said and recorded (for status and the report) as it is generated,
    the closing tail's not."""
    return merged_messages(cfg, _said(cfg, synthetic_passes(cfg, start, passes), passes))


def _said(
    cfg: PipelineConfig, batches: Iterable[tuple[str, SyntheticBatch]], passes: int
) -> Iterator[SyntheticBatch]:
    for index, (pass_id, batch) in enumerate(batches):
        if index < passes:
            best, tasks = best_auc(cfg, batch), batch.best_task_aucs(cfg.labels)
            record_best_auc(
                cfg.paths.data_root, {pass_id: best}, {pass_id: tasks} if tasks else None
            )
            said = "".join(f", {task} {auc:.4f}" for task, auc in tasks.items())
            print(
                f"pass {pass_id}: {len(batch.events)} impressions, best reachable AUC "
                f"{best:.4f}{said}",
                file=sys.stderr,
            )
        yield batch


if __name__ == "__main__":
    sys.exit(main())
