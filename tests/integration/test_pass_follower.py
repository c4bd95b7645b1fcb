"""One pass follower leads per pipeline (``ops.pass_follower``): the holder of a Redis
lease, renewed on its own thread through long commands; when the leader stops renewing,
another follower takes the lead once the lease lapses. On a real redis-server, with no
pass to train (no cluster needed: the followers only look for one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from ops import pass_follower
from ops.pass_follower import PassFollower

pytestmark = pytest.mark.timeout(60)
LEASE_S = 1.5  # the tests' lease: a few renewals a second


def _until(condition: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``condition`` held; fails after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, "timed out"
        time.sleep(0.05)
    return time.monotonic() - started


def test_one_follower_leads_and_another_takes_over_when_it_stops(
    make_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pass_follower, "LEASE_S", LEASE_S)
    cfg = make_config()
    stops = [threading.Event(), threading.Event()]
    followers = [PassFollower(cfg, stop, f"node-{i}") for i, stop in enumerate(stops)]
    threads = [threading.Thread(target=f.run, daemon=True) for f in followers]
    try:
        threads[0].start()
        _until(lambda: followers[0].leads, 5)
        threads[1].start()
        # renewed from its own thread well past the lease's life: the lead stays
        time.sleep(3 * LEASE_S)
        assert followers[0].leads and not followers[1].leads
        stops[0].set()  # the leader stops (its node shuts down): its lease is given back
        threads[0].join(timeout=10)
        taken = _until(lambda: followers[1].leads, 3 * LEASE_S)
        assert not followers[0].leads
        print(f"the second follower led {taken:.2f} s after the first stopped")
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(timeout=10)
