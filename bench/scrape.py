"""What a Prometheus scrape costs the processes that serve one.

``--passes`` synthetic passes are built by the real broker and pass builder and trained,
judged and delivered by the cluster's pass follower (the gate open). Then, each as its own
process on loopback, as an operator runs them:

- ``streamrec exporter`` (reads the newest 20 passes, its default ``--limit``, and the
  serving and the cluster summaries through ``ops.status`` at each scrape);
- ``streamrec build-passes --metrics-port`` on the same topics, caught up (its snapshot of
  two partitions);
- the baseline: prometheus-client's own HTTP server serving as many constant gauges as the
  exporter's scrape has samples (what the library costs, with nothing to read).

Each is scraped ``--scrapes`` times, ``--interval`` apart, and its CPU time (user + system,
from /proc) over the scrapes, less what it used idle over as long a time before them, is
divided by the scrapes.

    .venv/bin/python bench/scrape.py [--passes 20] [--scrapes 200] [--interval 0.05]

Ends with ``RESULT exporter_scrape_cpu_ms``, ``RESULT builder_scrape_cpu_ms``,
``RESULT baseline_scrape_cpu_ms`` (CPU milliseconds a scrape) and
``RESULT exporter_scrape_wall_ms`` (the median scrape's wall time, as Prometheus waits).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import psutil
from machine import hardware_line
from pipeline import STREAMREC, bench_config, build, delivering_every_pass
from prometheus_client.parser import text_string_to_metric_families

from devservices.local_services import local_services
from serving_export.delivery import registry_for
from streamrec.config import derived, dump_config
from streamrec.ports import free_port

BASELINE = """
import sys, time
from prometheus_client import CollectorRegistry, Gauge, start_http_server
registry = CollectorRegistry()
gauge = Gauge("baseline_value", "A constant.", ["pipeline", "i"], registry=registry)
for i in range(int(sys.argv[2])):
    gauge.labels("bench", str(i)).set(i)
start_http_server(int(sys.argv[1]), "127.0.0.1", registry)
while True:
    time.sleep(60)
"""


@contextmanager
def _serving(args: list[str], port: int, log: Path) -> Iterator[psutil.Process]:
    """``args`` as a process until its ``/metrics`` on ``port`` answers; killed after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{args[:2]} exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{args[:2]} did not serve /metrics")
            time.sleep(0.2)
        yield psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def _cluster(config: Path, log: Path) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [STREAMREC, "cluster", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def _loopback(prefix: str, port: int) -> list[str]:
    return [f"--{prefix}host", "127.0.0.1", f"--{prefix}port", str(port)]


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _measure(
    name: str, process: psutil.Process, port: int, scrapes: int, interval: float
) -> tuple[float, float, int]:
    """CPU ms a scrape (idle use subtracted), the median wall ms, the samples a scrape."""
    url = f"http://127.0.0.1:{port}/metrics"
    httpx.get(url, timeout=10)  # the first scrape's imports and caches are not a scrape's
    started, before = time.monotonic(), _cpu(process)
    time.sleep(scrapes * interval)
    idle = (_cpu(process) - before) / (time.monotonic() - started)
    walls, text = [], ""
    started, before = time.monotonic(), _cpu(process)
    with httpx.Client(timeout=30) as client:
        for _ in range(scrapes):
            t = time.perf_counter()
            text = client.get(url).text
            walls.append(time.perf_counter() - t)
            time.sleep(interval)
    spent = _cpu(process) - before - idle * (time.monotonic() - started)
    samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
    per_scrape = max(spent, 0.0) / scrapes * 1000
    wall = statistics.median(walls) * 1000
    print(
        f"{name}: {per_scrape:.2f} ms CPU a scrape ({idle * 1000:.1f} ms/s idle subtracted), "
        f"median wall {wall:.2f} ms, {samples} samples",
        flush=True,
    )
    return per_scrape, wall, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20, help="passes trained before")
    parser.add_argument("--events-per-pass", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between scrapes")
    args = parser.parse_args()
    print(hardware_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        services = stack.enter_context(local_services(root / "services"))
        cfg = bench_config(services, root, "scrape", args.events_per_pass)
        cfg = derived(
            delivering_every_pass(cfg, 5), "the scrape run", cluster={"follow_passes": True}
        )
        config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
        passes = build(cfg, args.passes)
        # `streamrec cluster` as an operator runs it: its node agent heartbeats (the
        # exporter's cluster figures) and its pass follower trains and delivers the passes
        stack.enter_context(_cluster(config, root / "cluster.log"))
        registry = registry_for(cfg)
        deadline = time.monotonic() + 1200
        while (registry.serving_version() or "") < passes[-1]:
            if time.monotonic() > deadline:
                raise SystemExit("the passes were not trained and delivered in time")
            time.sleep(1)
        print(f"{len(passes)} passes trained and delivered; scraping", flush=True)
        port = free_port()
        print("the exporter reads the newest 20 passes a scrape (its default --limit)")
        exporter = stack.enter_context(
            _serving(
                [STREAMREC, "exporter", f"--config={config}", *_loopback("", port)],
                port,
                root / "exporter.log",
            )
        )
        ours = _measure("streamrec exporter", exporter, port, args.scrapes, args.interval)
        port = free_port()
        builder = stack.enter_context(
            _serving(
                [STREAMREC, "build-passes", "--config", str(config), *_loopback("metrics-", port)],
                port,
                root / "builder.log",
            )
        )
        time.sleep(2)  # its first snapshot
        built = _measure("streamrec build-passes", builder, port, args.scrapes, args.interval)
        port = free_port()
        script = root / "baseline.py"
        script.write_text(textwrap.dedent(BASELINE))
        base = stack.enter_context(
            _serving(
                [sys.executable, str(script), str(port), str(ours[2])], port, root / "base.log"
            )
        )
        baseline = _measure("baseline (constant gauges)", base, port, args.scrapes, args.interval)
    print(f"RESULT exporter_scrape_cpu_ms {ours[0]:.2f}")
    print(f"RESULT builder_scrape_cpu_ms {built[0]:.2f}")
    print(f"RESULT baseline_scrape_cpu_ms {baseline[0]:.2f}")
    print(f"RESULT exporter_scrape_wall_ms {ours[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
