"""How cluster members wait for each other (trainers/hosts/peer_wait.py): on real sockets, and
the one fact about Paddle's source the Gloo store's short naps rest on."""

from __future__ import annotations

import ast
import importlib.util
import socket
import threading
import time
from pathlib import Path

import pytest

from trainers.hosts import peer_wait
from trainers.hosts.topology import ROLE_ENV


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_waits_until_every_endpoint_listens() -> None:
    early = socket.create_server(("127.0.0.1", 0))
    late_port = _closed_port()
    late: list[socket.socket] = []
    listen = lambda: late.append(socket.create_server(("127.0.0.1", late_port)))  # noqa: E731
    timer = threading.Timer(0.3, listen)
    timer.start()
    try:
        endpoints = [f"127.0.0.1:{early.getsockname()[1]}", f"127.0.0.1:{late_port}"]
        assert not peer_wait.listening(endpoints[1])
        started = time.monotonic()
        assert peer_wait.wait_listening(endpoints, timeout_s=10)
        assert time.monotonic() - started >= 0.25  # it did wait for the late one
    finally:
        timer.join()
        early.close()
        for s in late:
            s.close()


def test_gives_up_at_its_timeout_for_an_endpoint_that_never_listens() -> None:
    assert not peer_wait.wait_listening([f"127.0.0.1:{_closed_port()}"], timeout_s=0.2)


def test_waits_only_where_paddle_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(peer_wait.GLOO_ENV, "10.0.0.1:7000")
    monkeypatch.setenv(peer_wait.SERVERS_ENV, "10.0.0.1:7001,10.0.0.2:7001")
    monkeypatch.setenv(peer_wait.WITH_GLOO_ENV, "1")
    assert peer_wait.gloo_store() == ["10.0.0.1:7000"]
    assert peer_wait.servers() == ["10.0.0.1:7001", "10.0.0.2:7001"]
    monkeypatch.setenv(peer_wait.WITH_GLOO_ENV, "0")
    monkeypatch.setenv(peer_wait.LAUNCH_BARRIER_ENV, "0")
    assert peer_wait.gloo_store() == [] and peer_wait.servers() == []
    monkeypatch.setenv(peer_wait.WITH_GLOO_ENV, "1")
    monkeypatch.delenv(peer_wait.LAUNCH_BARRIER_ENV)
    monkeypatch.setenv(peer_wait.PADDLE_NAPS_ENV, "1")  # Paddle's own waits, as shipped
    assert peer_wait.gloo_store() == [] and peer_wait.servers() == []


def test_a_members_role_comes_from_fleetrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for role in ("PSERVER", "TRAINER"):
        monkeypatch.setenv(ROLE_ENV, role)
        assert peer_wait.member_role() == role
    monkeypatch.delenv(ROLE_ENV)
    assert peer_wait.member_role() is None  # not started by fleetrun: no waits, no patch


def test_short_naps_are_short() -> None:
    started = time.monotonic()
    peer_wait.ShortNaps.sleep(5)
    assert time.monotonic() - started < 1


def test_paddles_role_maker_uses_time_only_for_the_gloo_stores_nap() -> None:
    """``shorten_gloo_store_naps`` swaps the role maker's ``time`` module: right only while
    its one use is the nap of the store's loop (``while ... not should_stop(): sleep``)."""
    spec = importlib.util.find_spec("paddle")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "distributed" / "fleet" / "base" / "role_maker.py"
    tree = ast.parse(path.read_text())
    uses = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "time"
    ]
    assert [u.attr for u in uses] == ["sleep"]
    loops = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.While) and "should_stop" in ast.unparse(node.test)
    ]
    assert len(loops) == 1 and "time.sleep" in ast.unparse(loops[0].body[-1])
