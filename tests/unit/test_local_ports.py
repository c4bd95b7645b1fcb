"""Ports for local services: from the configured range (or below the kernel's ephemeral
range), never one that is listened on, never the same twice in a process."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from devservices.kafka_broker import cluster_id
from streamrec.errors import ServiceError
from streamrec.ports import PORT_RANGE_ENV, free_port, port_range


def test_default_range_is_below_the_ephemeral_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = port_range()
    assert ports.stop == ephemeral and len(ports) >= 1000


def test_ports_come_from_the_range_once_each_and_skip_listened_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        low = max(1024, port - 9)
        monkeypatch.setenv(PORT_RANGE_ENV, f"{low}-{port}")
        got: list[int] = []
        with pytest.raises(ServiceError, match=PORT_RANGE_ENV):  # the range runs out
            while True:
                got.append(free_port())
    assert got and port not in got
    assert len(set(got)) == len(got)
    assert all(low <= p <= port for p in got)


def test_a_kafka_cluster_id_is_never_read_as_an_option() -> None:
    """One URL-safe base64 id in 64 starts with "-", which Kafka's storage tool takes for an
    option; 5000 draws would meet about 78 such ids."""
    ids = [cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids) and all(len(i) == 22 for i in ids)
