"""One way to wait for something: a check polled until it answers or a deadline passes.

Every wait in streamrec (a service answering at start, a command done on the cluster, the
workers reporting, a pass directory appearing, a storage marker showing up) is this loop;
what differs is the check, which raises for a failure that waiting cannot mend (a process
that exited), and what the caller raises on a timeout, which names what it waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(check: Callable[[], T | None], timeout_s: float, interval_s: float) -> T | None:
    """Call ``check`` every ``interval_s`` seconds until it returns something other than
    None, and return that; None once ``timeout_s`` has passed. The check runs at least once
    and once more at or after the deadline, so a slow check never loses its last chance."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))
