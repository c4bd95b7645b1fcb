"""The pass builder's Kafka edge: the topics it reads, its consumer in the group, and the
dead-letter topics it writes. Nothing here knows about windows or slices.

Built without I/O; ``open`` prepares the topics (each with its dead-letter topic), checks
that impressions and clicks have as many partitions (they are joined by ``event_id``,
partition by partition) and starts the clients. Partitions come and go through the
``on_assigned`` and ``on_revoked`` callbacks (the range assignor gives the same partition
of both topics to the same member).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    UnsupportedCodecError,
)
from kafka.structs import OffsetAndMetadata

from streaming.codecs import from_kafka_error
from streaming.errors import KafkaUnavailable, MalformedEvent, StreamingError
from streaming.kafka_clients import client_settings, producer_settings
from streaming.topics import (
    CONSUMER_FETCH,
    HEARTBEAT_MS,
    METADATA_MAX_AGE_MS,
    ensure_topic,
    partition_count,
)
from streamrec.config import KafkaConfig, PipelineConfig

Records = dict[TopicPartition, list[Any]]  # one poll: the messages of each topic-partition


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, assigned: Callable[[Any], None], revoked: Callable[[Any], None]) -> None:
        self._assigned, self._revoked = assigned, revoked

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._revoked(revoked)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._assigned(assigned)


def topic_key(cfg: PipelineConfig, kind: str) -> str:
    """The config key naming the topic of ``kind`` (impressions, or a joined label)."""
    if kind == "impressions":
        return (
            "serving.log_topic"
            if cfg.passes.cut_from == "served_log"
            else "kafka.impressions_topic"
        )
    if cfg.join.mode == "click_join":
        return "join.clicks_topic"
    return f"schema.labels ({kind}).topic"


class KafkaSource:
    """The consumer of ``topics`` (kind -> topic name) and their dead-letter producer."""

    def __init__(
        self,
        cfg: PipelineConfig,
        topics: dict[str, str],
        consumer_factory: Callable[[], KafkaConsumer] | None = None,
        dlq_factory: Callable[[], KafkaProducer] | None = None,
    ) -> None:
        self._cfg = cfg
        self._kafka: KafkaConfig = cfg.kafka
        self.topics = topics
        self._consumer_factory = consumer_factory or self._default_consumer
        self._dlq_factory = dlq_factory or self._default_dlq
        self._consumer: KafkaConsumer | None = None
        self._dlq: KafkaProducer | None = None
        self._dlq_unflushed = False
        self._listener: _Rebalance | None = None
        # (topic, partition, reason) -> events sent to the dead-letter topic
        self.dead_letters: Counter[tuple[str, int, str]] = Counter()

    def open(self, on_assigned: Callable[[Any], None], on_revoked: Callable[[Any], None]) -> int:
        """Prepare the topics, start the clients and join the group (a consumer from the
        factory given is used as it comes); the partition count."""
        partitions = self._prepare_topics()
        self._listener = _Rebalance(on_assigned, on_revoked)
        self._dlq = self._dlq_factory()
        self._consumer = self._consumer_factory()
        return partitions

    def _prepare_topics(self) -> int:
        kafka, n = self._kafka, self._kafka.partitions
        dlq_ms = int(self._cfg.retention.dead_letter_days * 86_400_000)
        for topic in self.topics.values():
            ensure_topic(kafka, topic, n)
            ensure_topic(kafka, topic + kafka.dlq_suffix, 1, {"retention.ms": str(dlq_ms)})
        counts = {topic: partition_count(kafka, topic) for topic in self.topics.values()}
        if len(set(counts.values())) != 1:
            raise StreamingError(
                f"impressions and clicks must have the same number of partitions to be joined "
                f"by event_id, found {counts}: recreate the clicks topic to match"
            )
        return next(iter(counts.values()))

    def _default_consumer(self) -> KafkaConsumer:
        kafka = self._kafka
        consumer = KafkaConsumer(
            **client_settings(kafka),
            group_id=kafka.consumer_group,
            isolation_level=kafka.isolation_level,
            enable_auto_commit=False,
            **CONSUMER_FETCH,
            partition_assignment_strategy=[RangePartitionAssignor],
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=min(HEARTBEAT_MS, kafka.session_timeout_ms // 3),
            metadata_max_age_ms=METADATA_MAX_AGE_MS,
        )
        consumer.subscribe(list(self.topics.values()), listener=self._listener)
        return consumer

    def _default_dlq(self) -> KafkaProducer:
        return KafkaProducer(**producer_settings(self._kafka), linger_ms=5)

    @property
    def consumer(self) -> KafkaConsumer:
        """The open consumer (RuntimeError before ``open``)."""
        if self._consumer is None:
            raise RuntimeError("the Kafka source is not open")
        return self._consumer

    def poll(self, timeout_ms: int) -> Records:
        """One poll of the assigned partitions (a batch in a codec not installed here stops
        the read with the package to install)."""
        try:
            return self.consumer.poll(timeout_ms=timeout_ms)
        except UnsupportedCodecError as e:
            raise from_kafka_error(e, f"reading {', '.join(self.topics.values())}") from e
        except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as e:
            raise self._refused(e) from e

    def _refused(self, error: Exception) -> KafkaUnavailable:
        """The broker's ACLs refuse this principal a read: what it lacks and the key to fix."""
        kafka = self._kafka
        who = f"User:{kafka.sasl_username}" if kafka.sasl_username else "this client"
        if isinstance(error, GroupAuthorizationFailedError):
            what = f"READ on the group {kafka.consumer_group} (kafka.consumer_group)"
        else:
            named = ", ".join(f"{t} ({topic_key(self._cfg, k)})" for k, t in self.topics.items())
            what = f"READ on the topics {named}"
        return KafkaUnavailable(
            f"Kafka refuses {who} {what}: grant it on the brokers (kafka-acls --add "
            f"--allow-principal {who} --operation Read ...) or set kafka.sasl_username to a "
            f"user that has it; nothing was read ({error})"
        )

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        """Read ``tp`` from ``offset``; from its beginning when None."""
        if offset is None:
            self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, offset)

    def commit(self, partition: int, offsets: dict[str, int]) -> None:
        """Commit ``partition``'s offsets (topic -> offset), asynchronously: the slices, not
        the group's commits, are where a partition resumes."""
        self.consumer.commit_async(
            {
                TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                for topic, offset in offsets.items()
            }
        )

    def highwater(self, topic: str, partition: int) -> int | None:
        """The broker's end of a topic-partition at the last fetch (None before one)."""
        return self.consumer.highwater(TopicPartition(topic, partition))

    def position(self, topic: str, partition: int) -> int:
        """Where the read of a topic-partition stands (may ask the broker when unknown)."""
        return self.consumer.position(TopicPartition(topic, partition))

    def end_offsets(self, partition: int) -> dict[str, int]:
        """Topic -> the offset after ``partition``'s last readable record now (under
        read_committed, its last stable offset)."""
        tps = [TopicPartition(topic, partition) for topic in self.topics.values()]
        return {tp.topic: offset for tp, offset in self.consumer.end_offsets(tps).items()}

    def caught_up(self, topic: str, partition: int) -> bool:
        """True when everything the broker had for the partition at the last fetch is read."""
        high = self.highwater(topic, partition)
        return high is not None and self.position(topic, partition) >= high

    def dead_letter(self, topic: str, partition: int, message: Any, error: MalformedEvent) -> None:
        """Send ``message`` as it came (value, its key and headers after ours) to the
        topic's dead-letter topic, with the reason."""
        key = [("key", message.key)] if message.key is not None else []
        self.dead_letter_value(
            topic, partition, message.offset, message.value, error, [*key, *(message.headers or [])]
        )

    def dead_letter_value(
        self,
        topic: str,
        partition: int,
        offset: int,
        value: bytes | None,
        error: MalformedEvent,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Send ``value`` (the record at ``offset`` of ``topic``/``partition``) to the
        topic's dead-letter topic, with the reason and ``headers`` after ours."""
        if self._dlq is None:
            raise RuntimeError("the Kafka source is not open")
        source = f"{topic}/{partition}/{offset}"
        self.dead_letters[(topic, partition, error.reason)] += 1
        self._dlq_unflushed = True
        self._dlq.send(
            topic + self._kafka.dlq_suffix,
            key=source.encode(),
            value=value or b"",
            headers=[
                ("reason", error.reason.encode()),
                ("detail", error.detail[:500].encode()),
                ("source", source.encode()),
                *(headers or []),
            ],
        )

    def flush_dead_letters(self) -> None:
        """Make every dead letter sent so far durable."""
        if self._dlq is not None and self._dlq_unflushed:
            self._dlq.flush()
            self._dlq_unflushed = False

    def close(self) -> None:
        """Flush the dead letters, then close both clients (whichever were started)."""
        if self._dlq is not None:
            self._dlq.flush()
            self._dlq.close()
        if self._consumer is not None:
            self._consumer.close()
