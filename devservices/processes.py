"""The local processes the demo, the tests and the benchmarks start (a broker, a
redis-server): a started process with its address, and the wait until it answers on its
port.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamrec.errors import ServiceError
from streamrec.ports import free_port
from streamrec.waiting import poll_until

log = logging.getLogger(__name__)


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
