"""``streamrec cluster`` as an operator runs it: a child process, ready once every worker
heartbeats, stopped with SIGTERM (killed with its group if it overruns)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamrec.config import load_config
from trainers.control_plane import ClusterClient

CLI = str(Path(sys.executable).with_name("streamrec"))


@contextmanager
def cli_cluster(
    config: Path, *args: str, env: dict[str, str] | None = None, start_s: float = 180
) -> Iterator[ClusterClient]:
    """Run ``streamrec cluster --config config *args`` until the block ends; its client."""
    cfg = load_config(config)
    client = ClusterClient.from_config(cfg)
    log = open(Path(cfg.paths.work_root) / "streamrec-cluster.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [CLI, "cluster", "--config", str(config), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + start_s
        while len(client.live_workers()) < cfg.cluster.workers:
            if proc.poll() is not None:
                raise RuntimeError(f"streamrec cluster exited {proc.returncode} at start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"streamrec cluster not ready after {start_s:.0f} s")
            time.sleep(0.5)
        yield client
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def cli_json(*args: str) -> dict:
    """``streamrec *args``, which must succeed; the JSON of its last output line."""
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
