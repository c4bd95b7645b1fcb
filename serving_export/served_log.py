"""What ``streamrec serve`` scored, logged to Kafka off the request path.

With ``serving.log_topic`` set, every event a ``/predict`` answers becomes one record on
that topic, keyed by its event id: an impression as the pass builder reads it (``event_id``,
``event_time`` = when it was served, ``sparse`` and ``dense`` exactly as validated and
scored, defaults filled in) with what served it (``served``: the version, each task's
probability, the time in ms). So the served log can itself be the impressions a pass is
cut from: what trains is what served, and the pass keeps which version scored each row and
how (``ops.online`` judges every version on that).

Records go to librdkafka (``confluent_kafka``), which batches and sends them from
threads of its own, outside Python: once its requests are answered, a scoring call's
records are serialized and appended to librdkafka's bounded queue
(``serving.log_buffer_events``), which takes microseconds and never waits
(``serving_export.batcher``). A record the queue has no room for (Kafka slow or away for
long), that Kafka has not taken within ``TIMEOUT_MS`` or that it refused is counted as
unlogged: a request is answered whatever Kafka does. When Kafka is back, the queue
drains and logging goes on. Every record offered is logged or counted (``logged +
unlogged + backlog``). A thread of ours only waits for librdkafka's delivery reports and
counts them (and makes the topic).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from streamrec.config import KafkaConfig, SchemaConfig

log = logging.getLogger(__name__)
_encode = msgspec.json.Encoder().encode  # C: 0.6 µs a record against json.dumps's 5.6

TIMEOUT_MS = 60_000  # a record Kafka has not taken within a minute is counted unlogged
RETRY_SECONDS = 1.0  # pause before making the topic again when Kafka could not be reached
WARN_EVERY_S = 10.0  # at most one warning this often about records Kafka did not take


class Producer(Protocol):
    """The part of ``confluent_kafka.Producer`` the log uses."""

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes,
        *,
        on_delivery: Callable[[Any, Any], None],  # (KafkaError or None, the message)
    ) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...

    def purge(self) -> None: ...


@dataclass
class LogCounts:
    """What became of the records offered."""

    logged: int = 0  # acknowledged by Kafka
    unlogged: int = 0  # dropped: no room in the queue, not taken in time, or refused
    backlog: int = 0  # in the producer's queue, or sent and not yet acknowledged


def served_records(
    schema: SchemaConfig,
    rows: Sequence[dict[str, Any]],
    ids: Sequence[str],
    version: str,
    tasks: Sequence[str],
    scores: Sequence[Sequence[float]],
    now_ms: int,
) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) of each scored row: the impression as served and what served it."""
    slots = [s.name for s in schema.sparse]
    dense = [d.name for d in schema.dense]
    return [
        (
            event_id,
            {
                "event_id": event_id,
                "event_time": now_ms,
                "sparse": {s: row[s] for s in slots},
                "dense": {d: row[d] for d in dense},
                "served": {
                    "version": version,
                    "p": {t: scores[k][i] for k, t in enumerate(tasks)},
                    "at": now_ms,
                },
            },
        )
        for i, (event_id, row) in enumerate(zip(ids, rows, strict=True))
    ]


class ServedLog:
    """Served records handed to a librdkafka producer bound to ``capacity`` records, and
    the thread that counts its delivery reports."""

    def __init__(
        self,
        topic: str,
        producer: Producer,
        ensure_topic: Callable[[], None] = lambda: None,
    ) -> None:
        self.topic = topic
        self._producer = producer
        self._ensure_topic = ensure_topic
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._counts = LogCounts()
        self._warned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="served-log", daemon=True)

    @classmethod
    def to_kafka(cls, kafka: KafkaConfig, topic: str, capacity: int) -> ServedLog:
        """A log to ``topic`` on the pipeline's Kafka, made if missing."""
        from streaming.topics import ensure_topic

        producer = librdkafka_producer(kafka, capacity)
        return cls(topic, producer, lambda: ensure_topic(kafka, topic, kafka.partitions))

    def offer(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """Hand ``records`` to the producer; those it has no room for are counted unlogged.
        Never blocks on Kafka."""
        with self._lock:  # counted before produce: its report may come at once
            self._counts.backlog += len(records)
        dropped = 0
        for key, record in records:
            try:
                self._producer.produce(
                    self.topic,
                    value=_encode(record),
                    key=key.encode(),
                    on_delivery=self._delivered,
                )
            except BufferError:  # librdkafka's queue is full: Kafka slow or away
                dropped += 1
        if dropped:
            with self._lock:
                self._counts.unlogged += dropped
                self._counts.backlog -= dropped

    def counts(self) -> LogCounts:
        """What became of the records offered so far."""
        with self._lock:
            c = self._counts
            return LogCounts(c.logged, c.unlogged, c.backlog)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        """Stop after writing what is queued, for at most ``timeout_s``; what is left then
        is counted unlogged."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        if self._producer.flush(timeout_s):
            left = self.counts().backlog
            log.warning("served log: stopping with Kafka away; %d records unlogged", left)
            self._producer.purge()
            self._producer.flush(1)  # the purged records' reports: each counted unlogged

    def _delivered(self, error: Any, _message: Any) -> None:
        with self._lock:
            self._counts.backlog -= 1
            if error is None:
                self._counts.logged += 1
                return
            self._counts.unlogged += 1
        now = time.monotonic()
        if now - self._warned_at > WARN_EVERY_S:
            self._warned_at = now
            log.warning("served log: Kafka did not take a record (%s); counted", error)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._ensure_topic()
                break
            except Exception as e:  # Kafka away: records wait in librdkafka's queue meanwhile
                log.warning("served log: cannot make topic %s (%s); retrying", self.topic, e)
                self._stop.wait(RETRY_SECONDS)
        while not self._stop.is_set():
            self._producer.poll(0.2)  # waits outside the GIL; runs the delivery reports


def librdkafka_producer(
    kafka: KafkaConfig, capacity: int, timeout_ms: int = TIMEOUT_MS
) -> Producer:
    """A librdkafka producer with the pipeline's connection settings that holds at most
    ``capacity`` records and gives up on a record Kafka has not taken in ``timeout_ms``."""
    from confluent_kafka import Producer as Librdkafka

    from streaming.kafka_clients import librdkafka_settings

    return Librdkafka(
        {
            **librdkafka_settings(kafka),
            # acks=1 and no idempotence: a served log is at least once anyway (a retry after
            # a lost answer writes twice) and the builder drops a repeated event id
            "acks": 1,
            "enable.idempotence": False,
            # a produce request every half second: the broker's work per request (and ours
            # per acknowledgement) comes that seldom; a served log needs no lower latency
            "linger.ms": 500,
            # the Java client's (and kafka-python's) partitioner: a label event keyed by the
            # same event id lands on this record's partition, as the join needs
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": capacity,
            "message.timeout.ms": timeout_ms,
        },
        logger=log,
    )


def now_ms() -> int:
    """The wall clock in epoch milliseconds: a served record's time."""
    return int(time.time() * 1000)
