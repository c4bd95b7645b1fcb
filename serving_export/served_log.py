"""What ``streamrec serve`` scored, logged to Kafka off the request path.

With ``serving.log_topic`` set, every event a ``/predict`` answers becomes one record on
that topic, keyed by its event id: an impression as the pass builder reads it (``event_id``,
``event_time`` = when it was served, ``sparse`` and ``dense`` exactly as validated and
scored, defaults filled in) with what served it (``served``: the version, each task's
probability, the time in ms). So the served log can itself be the impressions a pass is
cut from: what trains is what served.

Requests only append their records to a bounded queue (``serving.log_buffer_events``); a
thread of its own hands them to a Kafka producer in batches. A record the queue has no room
for (Kafka slow or away for long) or that Kafka refused is counted as unlogged, never
waited for: a request is answered whatever Kafka does. While Kafka is away the queue holds
what it can and the thread retries; when Kafka is back it drains the queue and logging goes
on. Every record offered is logged or counted (``logged + unlogged + backlog``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer

from streamrec.config import KafkaConfig, SchemaConfig

log = logging.getLogger(__name__)

BATCH = 500  # records handed to the producer between two checks of its progress
RETRY_SECONDS = 1.0  # pause after Kafka refused a batch or could not be reached


@dataclass
class LogCounts:
    """What became of the records offered."""

    logged: int = 0  # acknowledged by Kafka
    unlogged: int = 0  # dropped: no room in the queue, or refused by Kafka
    backlog: int = 0  # waiting to be logged now (queued, or being handed to Kafka)


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
    """A bounded queue of served records and the thread that writes them to ``topic``."""

    def __init__(
        self,
        topic: str,
        capacity: int,
        producer_factory: Callable[[], KafkaProducer],
        ensure_topic: Callable[[], None] = lambda: None,
    ) -> None:
        self.topic = topic
        self._ensure_topic = ensure_topic
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._capacity = capacity
        self._factory = producer_factory
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._counts = LogCounts()
        self._in_flight = 0  # records taken by the writer and not yet settled
        self._thread = threading.Thread(target=self._run, name="served-log", daemon=True)

    @classmethod
    def to_kafka(cls, kafka: KafkaConfig, topic: str, capacity: int) -> ServedLog:
        """A log to ``topic`` on the pipeline's Kafka, with its producers' settings."""
        from streaming.kafka_clients import producer_settings
        from streaming.topics import ensure_topic

        def producer() -> KafkaProducer:
            # acks=1 and no idempotence: a served log is at least once anyway (a retry after
            # a lost answer writes twice) and the builder drops a repeated event id; a
            # record Kafka has not taken within seconds is counted, not waited for
            settings = {**producer_settings(kafka), "acks": 1, "enable_idempotence": False}
            return KafkaProducer(
                **settings, linger_ms=20, max_block_ms=2000, retries=2, request_timeout_ms=5000
            )

        return cls(topic, capacity, producer, lambda: ensure_topic(kafka, topic, kafka.partitions))

    def offer(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """Queue ``records`` to be logged; those past the capacity are counted unlogged.
        Never blocks on Kafka."""
        with self._lock:
            room = self._capacity - len(self._queue) - self._in_flight
            taken = records[: max(room, 0)]
            self._queue.extend(taken)
            self._counts.unlogged += len(records) - len(taken)
        if taken:
            self._wake.set()

    def counts(self) -> LogCounts:
        """What became of the records offered so far."""
        with self._lock:
            c = self._counts
            return LogCounts(c.logged, c.unlogged, len(self._queue) + self._in_flight)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        """Stop after writing what is queued, for at most ``timeout_s``."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def _take(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
            self._in_flight = len(batch)
            return batch

    def _put_back(self, batch: list[tuple[str, dict[str, Any]]]) -> None:
        """Return a batch Kafka never took to the queue's front (its room was kept)."""
        with self._lock:
            self._queue.extendleft(reversed(batch))
            self._in_flight = 0

    def _give_up(self) -> None:
        with self._lock:
            left = len(self._queue)
            self._counts.unlogged += left
            self._queue.clear()
        log.warning("served log: stopping with Kafka away; %d records unlogged", left)

    def _done(self, logged: int, refused: int) -> None:
        with self._lock:
            self._counts.logged += logged
            self._counts.unlogged += refused
            self._in_flight = 0

    def _run(self) -> None:
        producer: KafkaProducer | None = None
        while True:
            batch = self._take()
            if not batch:
                if self._stop.is_set():
                    break
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                if producer is None:
                    self._ensure_topic()
                    producer = self._factory()
                futures = [
                    producer.send(self.topic, key=key.encode(), value=json.dumps(record).encode())
                    for key, record in batch
                ]
            except Exception as e:  # Kafka away: nothing of this batch was taken; retry it
                self._put_back(batch)
                producer = _closed(producer)
                if self._stop.is_set():  # stopping with Kafka away: what is left is unlogged
                    self._give_up()
                    break
                log.warning("served log: Kafka is unreachable (%s); retrying", e)
                self._stop.wait(RETRY_SECONDS)
                continue
            producer.flush()
            refused = sum(1 for f in futures if f.failed())
            self._done(len(futures) - refused, refused)
            if refused:
                log.warning("served log: Kafka refused %d records; counted unlogged", refused)
                producer = _closed(producer)
                self._stop.wait(RETRY_SECONDS)
        if producer is not None:
            producer.close(timeout=5)


def _closed(producer: KafkaProducer | None) -> None:
    """Close a producer that failed (a new one reconnects from scratch); None."""
    if producer is not None:
        try:
            producer.close(timeout=0)
        except Exception:  # closing a broken client: nothing left to save
            log.debug("closing the served log's producer failed", exc_info=True)
    return None


def now_ms() -> int:
    """The wall clock in epoch milliseconds: a served record's time."""
    return int(time.time() * 1000)
