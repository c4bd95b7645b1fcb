"""How fast a backlog of complete passes drains under Airflow's real scheduler.

The situation after an outage of Airflow: ``--passes`` one-minute windows of a stream are
complete passes on disk (built by the real broker and pass builder, ending a few minutes
ago), and nothing has trained them. The cluster starts, then Airflow's api-server,
scheduler and dag-processor with the DAG's schedule starting at the first window, as a
restarted deployment would, each run driving its passes (``cluster.follow_passes`` off).
Timed from Airflow being up until every pass is trained (its
checkpoint written) and the last one serves.

    .venv/bin/python bench/catchup.py [--passes 60] [--events-per-pass 2000]

Ends with ``RESULT catchup_speedup`` (window time caught up per second of wall time) and
``RESULT catchup_s_per_pass`` (from the first pass's checkpoint to the last's, per pass:
the training in the catch-up runs and the skipped runs after them together).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

from machine import hardware_line
from pipeline import bench_config, build

from demo.live import PASS_SECONDS, live_config
from devservices.local_services import local_services
from ops.airflow_local import LocalAirflow
from serving_export.delivery import registry_for
from streamrec.config import derived, dump_config
from streamrec.passes import PassClock
from trainers.checkpoints import list_checkpoints
from trainers.launcher import LocalCluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=60, help="complete passes to catch up")
    parser.add_argument("--events-per-pass", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to give up after")
    args = parser.parse_args()
    print(hardware_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-catchup-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        services = stack.enter_context(local_services(root / "services"))
        cfg = bench_config(services, root, "catchup", args.events_per_pass)
        # the backlog ends a few windows before now: the runs after it wait for data
        seconds = args.passes * PASS_SECONDS + 180
        start = PassClock(PASS_SECONDS).floor(datetime.now(UTC) - timedelta(seconds=seconds))
        # the DAG's own catch-up: each run drives its passes (no pass follower)
        cfg = derived(live_config(cfg, start), "the catch-up run", cluster={"follow_passes": False})
        config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
        passes = build(cfg, args.passes, start.strftime("%Y%m%d%H%M"))
        print(f"backlog: {len(passes)} complete passes, {passes[0]} to {passes[-1]}", flush=True)
        stack.enter_context(LocalCluster(cfg, config))
        stack.enter_context(LocalAirflow(Path(cfg.paths.work_root) / "airflow", config))
        up = time.time()
        registry = registry_for(cfg)
        trained_at: dict[str, float] = {}
        while time.time() - up < args.timeout:
            for c in list_checkpoints(cfg.paths.checkpoint_root):
                trained_at.setdefault(c.pass_id, time.time() - up)
            if set(passes) <= set(trained_at) and (registry.serving_version() or "") >= passes[-1]:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"{len(trained_at)} of {len(passes)} passes trained in time")
        wall = time.time() - up
    times = [trained_at[p] for p in passes]
    if times != sorted(times):
        raise SystemExit("passes were trained out of order")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    per_pass = (times[-1] - times[0]) / len(gaps) if gaps else wall
    print(
        f"Airflow up to the first pass trained {times[0]:.1f} s, to the last trained "
        f"{times[-1]:.1f} s, to it serving {wall:.1f} s; {per_pass:.2f} s a pass; gaps "
        f"between checkpoints: median {statistics.median(gaps or [0]):.2f} s, "
        f"longest {max(gaps or [0]):.2f} s (a catch-up's export and the skipped runs)"
    )
    print(f"RESULT catchup_speedup {len(passes) * PASS_SECONDS / wall:.2f}")
    print(f"RESULT catchup_s_per_pass {per_pass:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
