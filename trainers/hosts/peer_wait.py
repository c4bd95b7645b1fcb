"""A cluster's members find each other without Paddle's naps.

Three fixed naps made every cluster start (and every restart after a loss) 5 s longer than
its work, measured on the 2-core machine (docs/decisions/, bench/cluster_start.py):

- a worker checks a peer's endpoint with Paddle's ``wait_server_ready``, which sleeps 3 s
  between two checks, twice per start: in ``fleet.init`` for the Gloo HTTP store (which
  server 0 opens in its own ``fleet.init``) and in ``minimize`` for the servers' brpc ports.
  Both peers are still importing Paddle when the worker first looks. The worker now checks
  every 50 ms first (``wait_listening``), so Paddle's own check finds them listening;
- server 0 hosts that store in a child process that looks every 5 s whether every worker
  has joined, and its ``fleet.init`` waits for the child. ``shorten_gloo_store_naps`` makes
  that look every 50 ms.

``STREAMREC_PADDLE_NAPS=1`` in the cluster's environment leaves Paddle's waits as Paddle
ships them (the benchmark's baseline, and a way out on a Paddle build that differs).
"""

from __future__ import annotations

import os
import socket
import time

from streamrec.waiting import poll_until
from trainers.hosts.topology import ROLE_ENV, Role

GLOO_ENV = "PADDLE_GLOO_HTTP_ENDPOINT"  # set by fleetrun on every member
WITH_GLOO_ENV = "PADDLE_WITH_GLOO"
SERVERS_ENV = "PADDLE_PSERVERS_IP_PORT_LIST"
# Paddle waits for the servers only under its launch barrier (on unless this is "0")
LAUNCH_BARRIER_ENV = "FLAGS_LAUNCH_BARRIER"
PADDLE_NAPS_ENV = "STREAMREC_PADDLE_NAPS"
INTERVAL_S = 0.05
# past this, Paddle's own wait (which has no bound) takes over, as it would without us
TIMEOUT_S = 600.0


def paddle_naps() -> bool:
    """Whether this cluster keeps Paddle's own waits (``STREAMREC_PADDLE_NAPS=1``)."""
    return os.environ.get(PADDLE_NAPS_ENV, "0") == "1"


def listening(endpoint: str) -> bool:
    """Whether ``host:port`` accepts a connection now."""
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def wait_listening(endpoints: list[str], timeout_s: float = TIMEOUT_S) -> bool:
    """Wait until every endpoint accepts connections; False if ``timeout_s`` passed first."""
    pending = list(endpoints)

    def all_listening() -> bool | None:
        pending[:] = [e for e in pending if not listening(e)]
        return True if not pending else None

    return poll_until(all_listening, timeout_s, INTERVAL_S) is not None


def member_role() -> Role | None:
    """This process's role in a fleetrun cluster; None outside one."""
    role = os.environ.get(ROLE_ENV)
    return role if role in ("PSERVER", "TRAINER") else None  # type: ignore[return-value]


def gloo_store() -> list[str]:
    """The Gloo HTTP store a worker's ``fleet.init`` waits for: none without Gloo."""
    if paddle_naps() or os.environ.get(WITH_GLOO_ENV, "0") == "0":
        return []
    return [e for e in [os.environ.get(GLOO_ENV, "")] if e]


def servers() -> list[str]:
    """The servers' endpoints a worker's ``minimize`` waits for: none without the launch
    barrier (a program built where no server runs, as the scoring program's test does)."""
    if paddle_naps() or os.environ.get(LAUNCH_BARRIER_ENV, "1") == "0":
        return []
    return [e for e in os.environ.get(SERVERS_ENV, "").split(",") if e]


class ShortNaps:
    """What Paddle's role maker gets as its ``time`` module: its one use of it is the
    Gloo store's nap, which lasts 50 ms here."""

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, INTERVAL_S))


def shorten_gloo_store_naps() -> None:
    """Make server 0's Gloo store look for the workers every 50 ms instead of every 5 s.
    Paddle 2.6.2's role maker (the version the project pins) uses ``time`` for that sleep
    alone; tests/unit/test_peer_wait.py fails if a Paddle release changes that."""
    if paddle_naps():
        return
    from paddle.distributed.fleet.base import role_maker

    role_maker.time = ShortNaps  # type: ignore[assignment]
