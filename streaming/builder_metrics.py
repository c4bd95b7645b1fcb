"""The pass builder's own metrics: what only the process reading Kafka knows.

``streamrec build-passes --metrics-port P`` serves them on ``/metrics`` (prometheus-client):

- per owned partition and topic: the consumer's lag behind the broker's end, in records
  and in seconds (how old the newest record read is while the read is behind; 0 once it is
  caught up), and the records read and dead-lettered (by reason) since the start;
- per owned partition: its watermark (epoch seconds: its age is ``time()`` minus it), the
  impressions its join holds for windows not cut yet, and per label the rows written whose
  label window is still open;
- the passes this builder assembled.

The polling thread takes a ``BuilderSnapshot`` at most every ``SNAPSHOT_SECONDS`` and a
scrape reads the newest one: the Kafka client is not thread-safe, and the loop pays nothing
per record for it. The per-pass facts (rows, late events, freshness) are ``streamrec
exporter``'s, from the manifests every builder of the group writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from streamrec.errors import ConfigError
from streamrec.metric_families import Families

SNAPSHOT_SECONDS = 1.0


@dataclass(frozen=True)
class TopicPartitionFigures:
    """One owned topic-partition's read."""

    topic: str
    partition: int
    lag_records: int | None  # None: the broker's end is not known yet
    lag_seconds: float | None  # None: behind, with nothing read yet to date it
    records: int  # read since this builder started
    dead_letters: dict[str, int] = field(default_factory=dict)  # reason -> count


@dataclass(frozen=True)
class PartitionFigures:
    """One owned partition's join."""

    partition: int
    watermark_ms: int | None  # None: nothing seen yet
    waiting_rows: int
    open_rows: dict[str, int]  # label -> rows written whose label window is open


@dataclass(frozen=True)
class BuilderSnapshot:
    """What the builder's metrics show, as the polling thread last saw it."""

    topic_partitions: tuple[TopicPartitionFigures, ...]
    partitions: tuple[PartitionFigures, ...]
    passes_assembled: int


def builder_metrics(families: Families, snapshot: BuilderSnapshot) -> None:
    """``snapshot`` as metric families."""
    for tp in snapshot.topic_partitions:
        where = {"topic": tp.topic, "partition": str(tp.partition)}
        families.set(
            "builder_consumer_lag_records",
            "Records the builder's read of the topic-partition is behind the broker's end.",
            tp.lag_records,
            **where,
        )
        families.set(
            "builder_consumer_lag_seconds",
            "Age of the newest record read while the read is behind the broker's end; 0 "
            "once caught up.",
            tp.lag_seconds,
            **where,
        )
        families.count(
            "builder_records_read",
            "Records this builder read from the topic-partition since it started.",
            tp.records,
            **where,
        )
        for reason, count in sorted(tp.dead_letters.items()):
            families.count(
                "builder_dead_letters",
                "Events this builder sent to the topic's dead-letter topic, by reason.",
                count,
                reason=reason,
                **where,
            )
    for p in snapshot.partitions:
        partition = str(p.partition)
        families.set(
            "builder_watermark_timestamp_seconds",
            "Event time (epoch seconds) up to which the partition has seen everything; "
            "its age is time() minus it.",
            p.watermark_ms / 1000 if p.watermark_ms is not None else None,
            partition=partition,
        )
        families.set(
            "builder_waiting_rows",
            "Impressions the partition's join holds for windows not cut yet.",
            p.waiting_rows,
            partition=partition,
        )
        for label, rows in sorted(p.open_rows.items()):
            families.set(
                "builder_open_label_rows",
                "Rows written whose label window is still open (their final label comes later).",
                rows,
                partition=partition,
                label=label,
            )
    families.count(
        "builder_passes_assembled",
        "Passes this builder assembled since it started (any builder of the group may).",
        snapshot.passes_assembled,
    )


class BuilderCollector(Collector):
    """Reads the builder's newest snapshot at each scrape."""

    def __init__(self, pipeline: str, snapshot: Callable[[], BuilderSnapshot | None]) -> None:
        self.pipeline = pipeline
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        families = Families(self.pipeline)
        if (snapshot := self.snapshot()) is not None:
            builder_metrics(families, snapshot)
        yield from families


def serve_builder_metrics(
    pipeline: str, snapshot: Callable[[], BuilderSnapshot | None], host: str, port: int
) -> Callable[[], None]:
    """Serve the builder's metrics on ``host:port`` from a thread; the function that stops
    it. A port in use is a configuration error (exit 2)."""
    registry = CollectorRegistry()
    registry.register(BuilderCollector(pipeline, snapshot))
    try:
        server, thread = start_http_server(port, host, registry)
    except OSError as e:
        raise ConfigError(
            f"--metrics-port {port}: cannot listen on {host}:{port} ({e.strerror}): give a "
            "free port"
        ) from e

    def stop() -> None:
        server.shutdown()
        thread.join(timeout=5)

    return stop


def example_snapshot() -> BuilderSnapshot:
    """A snapshot where every figure is known (made-up values): what the metrics
    reference lists."""
    return BuilderSnapshot(
        topic_partitions=(TopicPartitionFigures("impressions", 0, 0, 0.0, 1, {"bad_json": 1}),),
        partitions=(PartitionFigures(0, 1_000, 1, {"click": 1}),),
        passes_assembled=1,
    )
