"""How ``streamrec serve`` stops: within ``serving.shutdown_grace_seconds`` of SIGTERM,
under any load.

On SIGTERM (or Ctrl-C) uvicorn closes its listening socket and asks every open connection
to close after its current answer; then, counted from the signal::

    0 .. 4/5 of the grace   the requests in flight are scored and answered
    at 4/5                  those still waiting are answered 503 shutting_down (a client or
                            balancer retries on another replica), and so is any later one
    then                    the version follower and the scoring task stop, and the served
                            log writes what it holds until the grace is over; what it could
                            not is counted unlogged
    at the grace            uvicorn cancels whatever still runs (a client that never sent
                            its whole body)
    at the grace + 5 s      if the process still runs (a call into a library that never
                            returns), a watchdog that needs no Python prints every thread's
                            stack and ends it with exit 1: the bound holds under any load

and the process exits 130, as every streamrec command stopped by a signal. That the signal
reaches Python at all, with Paddle Inference loaded, is ``streamrec.signals.handlers_kept``'s
doing.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import time
from collections.abc import Callable

from serving_export.batcher import ScoreBatcher

log = logging.getLogger(__name__)

ANSWER_SHARE = 0.8  # of the grace, for the requests in flight; the rest is the served log's
POLL_S = 0.05  # how often the watcher looks for the server's stop
HARD_STOP_AFTER_GRACE_S = 5.0  # the watchdog's margin: the interpreter's own exit fits in it


class StopClock:
    """When the service began to stop, and what is left of its grace. ``stopping`` tells
    whether the server was asked to stop (uvicorn's ``should_exit``, set by the signal);
    ``watchdog`` arms the hard stop (the service's process, not a test's)."""

    def __init__(
        self,
        grace_s: float,
        stopping: Callable[[], bool] = lambda: False,
        watchdog: bool = False,
    ) -> None:
        self.grace_s = grace_s
        self.stopping = stopping
        self.watchdog = watchdog
        self.began: float | None = None
        self.refused = 0

    def left(self) -> float:
        """Seconds of the grace left (all of it while serving)."""
        if self.began is None:
            return self.grace_s
        return max(0.0, self.grace_s - (time.monotonic() - self.began))

    def elapsed(self) -> float:
        """Seconds since the stop began (0 while serving)."""
        return 0.0 if self.began is None else time.monotonic() - self.began

    async def watch(self, batcher: ScoreBatcher, refusal: BaseException) -> None:
        """Wait for the stop; at ``ANSWER_SHARE`` of the grace, refuse what still waits
        with ``refusal``. Cancelled with the lifespan."""
        while not self.stopping():
            await asyncio.sleep(POLL_S)
        self.began = time.monotonic()
        if self.watchdog:  # faulthandler's C thread: it fires even while Python cannot run
            faulthandler.dump_traceback_later(self.grace_s + HARD_STOP_AFTER_GRACE_S, exit=True)
        answer_s = self.grace_s * ANSWER_SHARE
        log.info("stopping: answering the requests in flight for %.1f s", answer_s)
        await asyncio.sleep(answer_s)
        self.refused = batcher.refuse(refusal)
        if self.refused:
            log.warning(
                "stopping: %d requests still waiting after %.1f s answered 503 shutting_down",
                self.refused,
                answer_s,
            )
