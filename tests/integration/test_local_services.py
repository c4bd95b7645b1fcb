"""The local broker and redis-server helpers start real processes and clean them up."""

from __future__ import annotations

from pathlib import Path

import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from streaming.topics import ensure_topic
from streamrec.config import KafkaConfig
from streamrec.local_services import local_services


def test_services_answer_and_stop(tmp_path: Path) -> None:
    with local_services(tmp_path) as svc:
        client = redis.Redis.from_url(svc.redis_url)
        assert client.ping()
        ensure_topic(KafkaConfig(bootstrap_servers=svc.bootstrap_servers), "smoke", 2)
        producer = KafkaProducer(bootstrap_servers=svc.bootstrap_servers)
        producer.send("smoke", b"hello", partition=1).get(timeout=10)
        producer.close()
        consumer = KafkaConsumer(
            bootstrap_servers=svc.bootstrap_servers, auto_offset_reset="earliest"
        )
        consumer.assign([TopicPartition("smoke", 1)])
        records = consumer.poll(timeout_ms=5000)
        consumer.close()
        assert [m.value for batch in records.values() for m in batch] == [b"hello"]
        port = int(svc.redis_url.rsplit(":", 1)[1].split("/")[0])
    try:
        redis.Redis(port=port, socket_connect_timeout=1).ping()
        raise AssertionError("redis-server still answers after the block")
    except redis.ConnectionError:
        pass
