"""The served log's queue and writer on their own: every record offered is logged or
counted, the queue is bounded, a Kafka that cannot be reached or refuses loses nothing
silently. The producer is a small fake (pure logic: which records reach which send)."""

from __future__ import annotations

import time

from serving_export.served_log import ServedLog, served_records
from streamrec.config import PipelineConfig


class Future:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def failed(self) -> bool:
        return not self.ok


class Kafka:
    """A producer whose broker is up, down (cannot be reached) or refusing records."""

    def __init__(self) -> None:
        self.state = "up"
        self.sent: list[bytes] = []

    def producer(self) -> Kafka:
        if self.state == "down":
            raise ConnectionError("no broker")
        return self

    def send(self, topic: str, key: bytes, value: bytes) -> Future:
        if self.state == "down":
            raise ConnectionError("no broker")
        ok = self.state == "up"
        if ok:
            self.sent.append(key)
        return Future(ok)

    def flush(self) -> None:
        return None

    def close(self, timeout: float) -> None:
        return None


def _records(first: int, n: int) -> list[tuple[str, dict]]:
    return [(f"e{i}", {"event_id": f"e{i}"}) for i in range(first, first + n)]


def _settle(log: ServedLog, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while log.counts().backlog and time.monotonic() < deadline:
        time.sleep(0.01)


def test_every_record_is_logged_or_counted_and_the_queue_is_bounded() -> None:
    kafka = Kafka()
    log = ServedLog("served", capacity=50, producer_factory=kafka.producer)
    log.start()
    try:
        log.offer(_records(0, 30))
        _settle(log)
        assert log.counts().logged == 30 and kafka.sent[:2] == [b"e0", b"e1"]
        kafka.state = "down"  # the writer cannot reach Kafka: the queue holds what it can
        log.offer(_records(30, 80))
        counts = log.counts()
        assert counts.unlogged == 30 and counts.backlog == 50  # 80 offered, room for 50
        kafka.state = "up"  # back: the queue drains, in order
        _settle(log)
        counts = log.counts()
        assert (counts.logged, counts.unlogged, counts.backlog) == (80, 30, 0)
        assert kafka.sent[30:32] == [b"e30", b"e31"]
        kafka.state = "refusing"  # taken, then refused: counted, not retried
        log.offer(_records(110, 10))
        _settle(log)
        time.sleep(0.05)
        assert log.counts().unlogged == 40 and log.counts().logged == 80
    finally:
        log.stop()
    counts = log.counts()
    assert counts.logged + counts.unlogged + counts.backlog == 120


def test_a_record_is_the_impression_as_served_and_what_served_it(
    shipped_config: PipelineConfig,
) -> None:
    schema = shipped_config.feature_schema
    row = {s.name: ["a"] if s.multi else "a" for s in schema.sparse}
    row |= {d.name: 0.5 for d in schema.dense}
    [(key, record)] = served_records(
        schema, [row], ["ev"], "202601010000", ["click", "conversion"], [[0.2], [0.05]], 42
    )
    assert key == "ev"
    assert record == {
        "event_id": "ev",
        "event_time": 42,
        "sparse": {s.name: row[s.name] for s in schema.sparse},
        "dense": {d.name: 0.5 for d in schema.dense},
        "served": {"version": "202601010000", "p": {"click": 0.2, "conversion": 0.05}, "at": 42},
    }


def test_stopping_with_kafka_away_counts_what_is_left_and_returns() -> None:
    kafka = Kafka()
    kafka.state = "down"
    log = ServedLog("served", capacity=100, producer_factory=kafka.producer)
    log.start()
    log.offer(_records(0, 20))
    started = time.monotonic()
    log.stop()
    assert time.monotonic() - started < 3
    assert log.counts().unlogged == 20 and log.counts().backlog == 0
