"""Kafka topic administration and client settings shared by the producer and the builder."""

from __future__ import annotations

import logging

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from streaming.errors import KafkaUnavailable, StreamingError
from streaming.kafka_clients import client_settings
from streamrec.config import KafkaConfig

log = logging.getLogger(__name__)

# Brokers need a few seconds for a group join.
HEARTBEAT_MS = 1_000

# How the builder fetches; the ingest benchmark's bare loop uses the same settings.
# kafka-python sleeps ``retry_backoff_ms`` when a poll finds nothing buffered and nothing in
# flight, which happens between two fetches while the caller was busy with the last batch;
# the default 100 ms cost a busy builder ~0.3 s of every 3 s.
CONSUMER_FETCH = {
    "max_poll_records": 5000,
    "fetch_max_bytes": 16 * 1024 * 1024,
    "retry_backoff_ms": 10,
    "auto_offset_reset": "earliest",
}


def ensure_topic(
    kafka: KafkaConfig,
    topic: str,
    partitions: int,
    configs: dict[str, str] | None = None,
) -> None:
    """Create ``topic`` with ``partitions`` partitions (and topic ``configs`` such as
    ``retention.ms``) unless it exists."""
    try:
        admin = KafkaAdminClient(**client_settings(kafka), request_timeout_ms=10_000)
    except KafkaError as e:
        hint = ""
        if kafka.security_protocol != "PLAINTEXT":
            hint = (
                f"; check kafka.security_protocol ({kafka.security_protocol}), kafka.ssl_cafile "
                "and the SASL settings against the brokers' (the log above has the handshake)"
            )
        raise KafkaUnavailable(f"cannot reach Kafka at {kafka.bootstrap_servers}: {e}{hint}") from e
    try:
        if topic in admin.list_topics():
            return
        admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs or {})])
        log.info("created topic %s with %d partitions", topic, partitions)
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def partition_count(kafka: KafkaConfig, topic: str) -> int:
    """Number of partitions of ``topic``."""
    admin = KafkaAdminClient(**client_settings(kafka), request_timeout_ms=10_000)
    try:
        (description,) = admin.describe_topics([topic])
    except KafkaError as e:
        raise StreamingError(f"cannot describe topic {topic}: {e}") from e
    finally:
        admin.close()
    return len(description["partitions"])
