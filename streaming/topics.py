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
# a group joined before new topics' metadata reached its leader gets no partitions, and
# kafka-python rejoins only once its metadata is refreshed: by default every 5 minutes
METADATA_MAX_AGE_MS = 5_000

# How the builder fetches; the ingest benchmark's bare loop uses the same settings.
# kafka-python sleeps ``retry_backoff_ms`` when a poll finds nothing buffered and nothing in
# flight, which happens between two fetches while the caller was busy with the last batch;
# the default 100 ms cost a busy builder ~0.3 s of every 3 s.
CONSUMER_FETCH = {
    "max_poll_records": 5000,
    "fetch_max_bytes": 16 * 1024 * 1024,
    "max_partition_fetch_bytes": 8 * 1024 * 1024,
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
        raise KafkaUnavailable(
            f"cannot reach Kafka at {kafka.bootstrap_servers}: {e}{security_hint(kafka)}"
        ) from e
    try:
        if topic in admin.list_topics():
            return
        # -1: the brokers' default.replication.factor (a topic made with 1 on a replicated
        # cluster would have lost its data with one broker)
        admin.create_topics([NewTopic(topic, partitions, -1, topic_configs=configs or {})])
        log.info("created topic %s with %d partitions", topic, partitions)
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def security_hint(kafka: KafkaConfig) -> str:
    """Which settings to check when a secured broker cannot be bootstrapped from: every key
    the handshake used (the log above the error says which part the broker refused)."""
    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return ""
    keys = [f"kafka.security_protocol ({protocol})"]
    if protocol.endswith("SSL"):
        keys.append(f"kafka.ssl_cafile ({kafka.ssl_cafile or 'the system CAs'})")
    if protocol.startswith("SASL_"):
        keys.append(
            f"kafka.sasl_mechanism ({kafka.sasl_mechanism}), kafka.sasl_username "
            f"({kafka.sasl_username}) and kafka.sasl_password_env / kafka.sasl_password_file"
        )
    return (
        f"; check {', '.join(keys)} against the brokers' (in the log above, "
        "SaslAuthenticationFailedError is the user name or password, "
        "CERTIFICATE_VERIFY_FAILED the CA)"
    )


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
