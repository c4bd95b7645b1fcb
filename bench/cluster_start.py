"""How long ``streamrec cluster`` takes to start: seconds from the command until every
worker heartbeats, and the CPU seconds of the whole cluster (the command, fleetrun and its
members) from start to stop, on the shipped config (1 server, 2 workers).

The shipped start, where members find each other without Paddle's naps
(``trainers/hosts/peer_wait.py``), against **the baseline**, Paddle's own waits
(``STREAMREC_PADDLE_NAPS=1``), in alternating rounds in the same run on one embedded
broker and redis-server. Every restart after a loss goes through the same start.

    .venv/bin/python bench/cluster_start.py [--rounds 3]

Ends with ``RESULT cluster_start_s``, ``cluster_start_cpu_s`` (medians) and the same names
ending ``_baseline``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devservices.local_services import local_services
from streamrec.config import PathConfig, derived, dump_config, load_config, with_services
from streamrec.waiting import poll_until
from trainers.control_plane import ClusterClient
from trainers.hosts.peer_wait import PADDLE_NAPS_ENV

REPO = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("streamrec"))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(config: Path, client: ClusterClient, workers: int, naps: bool) -> tuple[float, float]:
    """One start of ``streamrec cluster`` until every worker heartbeats, then SIGTERM:
    (seconds to ready, CPU seconds of the command and everything it started)."""
    env = {**os.environ, PADDLE_NAPS_ENV: "1" if naps else "0"}
    before, started = _children_cpu(), time.monotonic()
    proc = subprocess.Popen(
        [CLI, "cluster", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ready = poll_until(lambda: len(client.live_workers()) >= workers or None, 300, 0.05)
    ready_s = time.monotonic() - started
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    if ready is None:
        raise SystemExit(f"the cluster did not start within 300 s (exit {proc.returncode})")
    return ready_s, _children_cpu() - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"shipped": [], "baseline": []}
    with tempfile.TemporaryDirectory() as scratch, local_services(Path(scratch)) as svc:
        shipped = load_config(REPO / "configs" / "pipeline.yaml")
        for round_ in range(args.rounds):
            for name in ("baseline", "shipped"):
                cfg = derived(
                    with_services(shipped, svc.bootstrap_servers, svc.redis_url),
                    "the benchmark's config",
                    name=f"start-{name}-{round_}",
                    paths=PathConfig.under(Path(scratch) / f"{name}-{round_}"),
                )
                Path(cfg.paths.work_root).mkdir(parents=True)
                config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
                client = ClusterClient.from_config(cfg)
                ready_s, cpu_s = measure(config, client, cfg.cluster.workers, name == "baseline")
                runs[name].append((ready_s, cpu_s))
                print(
                    f"round {round_ + 1} {name:8s}: ready {ready_s:4.1f} s, "
                    f"CPU {cpu_s:4.1f} s (start to stop)",
                    flush=True,
                )
    for name, starts in runs.items():
        suffix = "" if name == "shipped" else "_baseline"
        print(f"RESULT cluster_start_s{suffix} {statistics.median(s for s, _ in starts):.2f}")
        print(f"RESULT cluster_start_cpu_s{suffix} {statistics.median(c for _, c in starts):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
