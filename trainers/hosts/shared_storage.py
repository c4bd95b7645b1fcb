"""Every node of a cluster must see the same storage at its roots; checked at start.

Checkpoints are written by the servers of every host and restored by all, passes are read
by every worker, raw exports are written by worker 0 and packaged by the Airflow task that
publishes them. So ``paths.checkpoint_root``, ``paths.data_root`` and ``paths.work_root``
must be one shared filesystem, mounted at the same path on every host: a POSIX mount (NFS,
CephFS, a cloud file share). Paddle's HDFS/AFS client is not supported (docs/decisions/).

The first node agent to start writes a marker file holding a fresh token under each root
and puts the token in Redis (``cluster:storage``); every other node reads the marker under
its own roots and must find the same token. The key lives while any node refreshes it, so
the first node after a full stop writes a new marker.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import redis

from streamrec.atomic_fs import write_text_atomic
from streamrec.config import PathConfig
from streamrec.errors import ConfigError
from streamrec.redis_keys import RedisKeys
from streamrec.waiting import poll_until

log = logging.getLogger(__name__)

MARKER = ".streamrec-storage.json"
SHARED_ROOTS = ("checkpoint_root", "data_root", "work_root")


def check_shared_storage(
    r: redis.Redis,
    keys: RedisKeys,
    paths: PathConfig,
    node: str,
    ttl_s: float,
    wait_s: float = 10.0,
) -> None:
    """Write the marker (first node) or find it (every other); ConfigError naming the key
    whose directory does not hold it after ``wait_s`` (a shared mount may show a new file
    late)."""
    roots = {name: Path(getattr(paths, name)) for name in SHARED_ROOTS}
    mine = {"token": uuid.uuid4().hex, "node": node}
    if r.set(keys.cluster_storage, json.dumps(mine), nx=True, px=int(ttl_s * 1000)):
        expected = mine  # the first node: it writes the marker the others look for
    else:
        expected = json.loads(r.get(keys.cluster_storage) or json.dumps(mine))
    if expected["node"] == node:  # this node wrote it (now, or before a restart)
        for root in roots.values():
            root.mkdir(parents=True, exist_ok=True)
            write_text_atomic(root / MARKER, json.dumps(expected))
        log.info("shared storage: marker %s written by this node (%s)", expected["token"], node)
        return
    for name, root in roots.items():
        _find_marker(name, root, expected, node, wait_s)
    log.info("shared storage: this node (%s) sees %s's marker under every root", node, expected)


def _find_marker(name: str, root: Path, expected: dict, node: str, wait_s: float) -> None:
    found: list[dict | None] = [None]  # the marker read the last time

    def marked() -> bool | None:
        try:
            found[0] = json.loads((root / MARKER).read_text())
        except (OSError, ValueError):
            found[0] = None
        return True if found[0] and found[0].get("token") == expected["token"] else None

    if poll_until(marked, wait_s, 0.5) is None:
        what = "no marker" if found[0] is None else f"another marker ({found[0].get('node')}'s)"
        raise ConfigError(
            f"paths.{name}: {root} on node {node} holds {what}, not the one node "
            f"{expected['node']} wrote there: every node must see the same storage at "
            f"paths.{name} (one shared POSIX mount, at the same path on every host)"
        )


def keep_marker(r: redis.Redis, keys: RedisKeys, ttl_s: float) -> None:
    """A live node keeps the marker's token from expiring."""
    r.pexpire(keys.cluster_storage, int(ttl_s * 1000))
