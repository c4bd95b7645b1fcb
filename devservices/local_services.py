"""Apache Kafka and redis-server on free loopback ports, for the demo and the tests.

The broker is Apache Kafka as ``devservices.kafka_broker`` installs and runs it (one KRaft
node, its storage in the log folder); ``redis-server`` comes from Debian. Users who run
their own Kafka and Redis put their addresses in the config instead of ``embedded``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devservices.kafka_broker import start_kafka
from devservices.processes import RunningService, on_a_free_port, wait_until_answers
from streamrec.errors import ServiceError

log = logging.getLogger(__name__)


def start_redis(log_dir: Path, timeout: float = 30) -> RunningService:
    """Start redis-server (no persistence) on a free loopback port and wait for PING."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise ServiceError("redis-server is not installed: apt-get install -y redis-server")
    return on_a_free_port(lambda port: _start_redis(exe, port, log_dir, timeout))


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

    wait_until_answers(answers, f"redis-server on port {port}", proc, timeout, log_path)
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
        started.append(start_kafka(log_dir))
        started.append(start_redis(log_dir))
        yield LocalServices(started[0].address, started[1].address)
    finally:
        for service in reversed(started):
            service.stop()
