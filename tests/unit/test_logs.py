"""Log levels a person reads: a connection attempt a Kafka client retries is no ERROR."""

from __future__ import annotations

import logging

import pytest

from streamrec.logs import RetriedConnections


def _record(name: str, level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("name", "level", "message", "shown_as"),
    [
        (
            "kafka.net.manager",
            logging.ERROR,
            "Connection failed: KafkaConnectionError: 111",
            "WARNING",
        ),
        (
            "kafka.net.connection",
            logging.ERROR,
            "<KafkaConnection node_id=bootstrap-0>: Connection lost: KafkaConnectionError: 111",
            "WARNING",
        ),
        (
            "kafka.consumer.fetcher",
            logging.ERROR,
            "Fetch to node 1 failed: CorruptRecordError",
            "ERROR",
        ),
        ("streaming.pass_builder", logging.ERROR, "gave up: KafkaConnectionError: 111", "ERROR"),
        ("kafka.net.manager", logging.WARNING, "Bootstrap bootstrap-0 not ready", "WARNING"),
    ],
)
def test_only_kafkas_own_connection_attempts_are_demoted(
    name: str, level: int, message: str, shown_as: str
) -> None:
    record = _record(name, level, message)
    assert RetriedConnections().filter(record)  # never dropped
    assert (record.levelname, record.levelno) == (shown_as, logging.getLevelName(shown_as))
