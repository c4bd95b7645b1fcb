"""The local broker (Apache Kafka) and redis-server helpers start real processes and clean
them up."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from devservices import processes
from devservices.kafka_broker import KAFKA_VERSION
from devservices.local_services import local_services, start_redis
from streaming.topics import ensure_topic
from streamrec.config import KafkaConfig


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
        broker_port = int(svc.bootstrap_servers.rsplit(":", 1)[1])
    node = tmp_path / f"kafka-1-{broker_port}"
    assert f"Kafka version: {KAFKA_VERSION}" in (node / "broker.log").read_text()  # Kafka itself
    assert (node / "data" / ".kafka_cleanshutdown").is_file()  # stopped cleanly, not killed
    try:
        redis.Redis(port=port, socket_connect_timeout=1).ping()
        raise AssertionError("redis-server still answers after the block")
    except redis.ConnectionError:
        pass
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", broker_port), timeout=1).close()


def test_a_port_taken_before_the_bind_moves_the_service_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process binds the port between our check and redis-server's own bind (forced
    here by handing out a port a socket already listens on): the start retries elsewhere."""
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    handed = iter([port])
    real = processes.free_port
    monkeypatch.setattr(processes, "free_port", lambda: next(handed, None) or real())
    with taken:
        service = start_redis(tmp_path)
        try:
            assert service.address != f"redis://127.0.0.1:{port}/0"
            assert redis.Redis.from_url(service.address).ping()
        finally:
            service.stop()
    assert "in use" in (tmp_path / f"redis-{port}.log").read_text()  # it did meet the race
