"""The train commands a cluster ran, read from its control plane in Redis."""

from __future__ import annotations

import json
from typing import Any

from streamrec.config import PipelineConfig
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys


def train_runs(cfg: PipelineConfig) -> dict[str, list[dict[str, Any]]]:
    """Every train command the cluster completed, by pass: results that trained (not the
    'already done' acknowledgements of a repeated command)."""
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    runs: dict[str, list[dict[str, Any]]] = {}
    for key in scan_keys(r, keys.command("*")):
        command = r.hgetall(key)
        if command.get("kind") == "train" and command.get("status") == "done":
            result = json.loads(command["result"])
            if not result.get("already_done"):
                runs.setdefault(command["pass_id"], []).append(result)
    return runs
