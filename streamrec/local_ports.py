"""Loopback ports and the local processes that listen on them (the demo's and the tests'
services): a free port from a range no outgoing connection takes, a started process with
its address, and the wait until it answers.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import subprocess
from collections.abc import Callable
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


def wait_until_answers(
    check: Callable[[], object], what: str, proc: subprocess.Popen, timeout: float, log_path: Path
) -> None:
    """Call ``check`` until it stops raising; ServiceError (PortTaken when the log says the
    port was in use) if ``proc`` exits first or ``timeout`` passes."""
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


def on_a_free_port(start: Callable[[int], RunningService], attempts: int = 3) -> RunningService:
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
    stop_timeout: float = 10  # how long a clean stop may take before the process is killed

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
