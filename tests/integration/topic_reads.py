"""A topic as the tests read it back: every JSON message value of its partitions."""

from __future__ import annotations

import json
from typing import Any

from kafka import KafkaConsumer, TopicPartition


def read_topic(bootstrap: str, topic: str, partitions: int) -> list[dict[str, Any]]:
    """Every message value of ``topic`` (JSON), from the beginning, partition by partition."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    records = [json.loads(m.value) for m in consumer]
    consumer.close()
    return records
