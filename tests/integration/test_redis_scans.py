"""The pipeline's pattern scans on a real redis-server: every matching key, in a number of
round trips set by the keyspace over ``SCAN_COUNT``, not over redis-py's default of 10."""

from __future__ import annotations

import math
import time

import redis

from streamrec.config import RedisConfig
from streamrec.redis_conn import SCAN_COUNT, connect, scan_keys

FILLER = 5_000  # other keys in the same Redis (a sparse store beside the control plane)


def _scans(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def test_a_scan_finds_every_key_in_few_round_trips(services) -> None:
    r = connect(RedisConfig(url=services.redis_url))
    prefix = f"scan-{time.time_ns()}"
    pipe = r.pipeline(transaction=False)
    for i in range(FILLER):
        pipe.set(f"{prefix}:sparse:{i}", "x")
    for rank in range(3):
        pipe.set(f"{prefix}:heartbeat:worker:{rank}", "x")
    pipe.execute()
    try:
        before = _scans(r)
        found = sorted(scan_keys(r, f"{prefix}:heartbeat:worker:*"))
        trips = _scans(r) - before
        assert found == [f"{prefix}:heartbeat:worker:{rank}" for rank in range(3)]
        # SCAN visits the whole keyspace whatever the pattern; at redis-py's default of 10
        # keys a trip this is over 500 trips
        assert trips <= math.ceil(r.dbsize() / SCAN_COUNT) + 2, trips
    finally:
        r.delete(*scan_keys(r, f"{prefix}:*"))
