"""The served log on its own, with librdkafka's real producer and no broker listening (a
free loopback port): the producer's queue is bounded, a record Kafka does not take in time
is counted, stopping with Kafka away counts what is left and returns. Logging to a real
broker, stopped and started again, is tests/integration/test_serving.py's."""

from __future__ import annotations

import time

from serving_export.served_log import ServedLog, librdkafka_producer, served_records
from streamrec.config import PipelineConfig, derived
from streamrec.ports import free_port


def _log(cfg: PipelineConfig, capacity: int, timeout_ms: int) -> ServedLog:
    away = derived(cfg, "no broker", kafka={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    return ServedLog("served", librdkafka_producer(away.kafka, capacity, timeout_ms))


def _records(first: int, n: int) -> list[tuple[str, dict]]:
    return [(f"e{i}", {"event_id": f"e{i}"}) for i in range(first, first + n)]


def test_the_queue_is_bounded_and_what_kafka_does_not_take_in_time_is_counted(
    shipped_config: PipelineConfig,
) -> None:
    log = _log(shipped_config, capacity=50, timeout_ms=1000)
    log.start()
    try:
        started = time.monotonic()
        log.offer(_records(0, 80))
        assert time.monotonic() - started < 0.5  # nothing waited on Kafka
        counts = log.counts()
        assert (counts.logged, counts.unlogged, counts.backlog) == (0, 30, 50)  # room for 50
        deadline = time.monotonic() + 10
        while log.counts().backlog:  # not taken within a second: each one counted
            assert time.monotonic() < deadline, log.counts()
            time.sleep(0.05)
        assert log.counts() == type(counts)(0, 80, 0)
    finally:
        log.stop(timeout_s=1)


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


def test_stopping_with_kafka_away_counts_what_is_left_and_returns(
    shipped_config: PipelineConfig,
) -> None:
    log = _log(shipped_config, capacity=100, timeout_ms=60_000)
    log.start()
    log.offer(_records(0, 20))
    started = time.monotonic()
    log.stop(timeout_s=1)
    assert time.monotonic() - started < 3
    counts = log.counts()
    assert (counts.logged, counts.unlogged, counts.backlog) == (0, 20, 0)
