"""Freshness of the whole pipeline against the doc-style reference, on one live stream.

A live synthetic stream (``--rate`` impressions/s, Poisson arrivals, labels in the
impressions) goes to the embedded broker; passes are one minute with 5 s allowed lateness.
On the same events, in the same run:

- **streamrec** as a user runs it: ``streamrec build-passes``, ``streamrec cluster``,
  Airflow's real api-server, scheduler and dag-processor running dags/streamrec_pass.py
  (sensor, train, gate, export, deliver) and ``streamrec serve``, whose ``GET /version``
  this script polls every 0.2 s: a pass is served when /version first names it.
- **the reference** (bench/reference_pipeline.py): a consumer writes each window's events to
  text files; after the window's end plus the lateness a fresh fleetrun job loads the last
  checkpoint, trains with ``train_from_dataset``, saves and exports an inference model. It
  counts as served when that export is written: no serving load, which flatters it.

The stream starts first and Airflow's schedule from its window, as a user deploying onto a
running stream would. The first full window is a warm-up on both sides; the ``--passes``
after it are measured. **Freshness** = serving time minus the window's end; **overhead** =
freshness minus the lateness wait. CPU seconds (user + system, with reaped children) and
memory (PSS: shared pages split between the processes sharing them, so Paddle's library
and Airflow's forks are not counted once per process) are sampled per process tree every
second; the broker serves both and is reported apart (the producer runs in this script).
CPU per 1k events counts from the first measured window's start until the pipeline served
the last one, so both sides include the warm-up pass's training and a few seconds of the
next window's ingestion: a little high, on both alike.

    .venv/bin/python bench/e2e.py [--rate 200] [--passes 10]

Ends with ``RESULT freshness_p50_s``, ``overhead_p50_s`` (streamrec's) and
``freshness_ratio`` (streamrec's p50 over the reference's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from machine import hardware_line
from pipeline import REPO, STREAMREC, bench_config

from demo.live import live_config
from ops.airflow_local import LocalAirflow
from streaming.producer import produce_live
from streamrec.config import PipelineConfig, dump_config
from streamrec.errors import ContractError
from streamrec.local_services import LocalServices, free_port, local_services
from streamrec.passes import compose_pass_id, pass_dir, read_manifest, window_ms
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import ClusterClient

OURS, REFERENCE, SHARED = "streamrec", "reference", "broker"


@dataclass
class TreeMeter:
    """CPU seconds and peak PSS of groups of process trees (each group in named parts),
    sampled by a thread. A tree's CPU is each live process's own time plus what it reaped
    from its children, so a short-lived child (an Airflow task, a fleetrun job) counts
    once, in its parent."""

    parts: dict[tuple[str, str], list[psutil.Process]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # by "group" and "group:part"
    peak_pss: dict[str, float] = field(default_factory=dict)  # by group
    marks: dict[str, float] = field(default_factory=dict)  # "<group or part>/<mark>" -> CPU s
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, group: str, part: str, pid: int) -> None:
        self.parts.setdefault((group, part), []).append(psutil.Process(pid))

    def sample(self) -> None:
        with self._lock:
            totals: dict[str, list[float]] = {}
            for (group, part), roots in self.parts.items():
                cpu = pss = 0.0
                for p in _trees(roots):
                    try:
                        t, m = p.cpu_times(), p.memory_full_info()
                    except psutil.Error:  # exited since the listing
                        continue
                    cpu += t.user + t.system + t.children_user + t.children_system
                    pss += m.pss
                # a child that exited but is not reaped yet is briefly in no one's time
                key = f"{group}:{part}"
                self.cpu[key] = max(cpu, self.cpu.get(key, 0.0))
                total = totals.setdefault(group, [0.0, 0.0])
                total[0] += self.cpu[key]
                total[1] += pss
            for group, (cpu, pss) in totals.items():
                self.cpu[group] = cpu
                self.peak_pss[group] = max(pss, self.peak_pss.get(group, 0.0))

    def mark(self, group: str, name: str) -> None:
        """Remember the CPU seconds of ``group`` and of each of its parts now, as ``name``."""
        self.sample()
        with self._lock:
            for key, seconds in self.cpu.items():
                if key == group or key.startswith(f"{group}:"):
                    self.marks[f"{key}/{name}"] = seconds

    def between(self, key: str, first: str, last: str) -> float:
        return self.marks[f"{key}/{last}"] - self.marks[f"{key}/{first}"]

    def run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


def _trees(roots: list[psutil.Process]) -> list[psutil.Process]:
    procs = []
    for root in roots:
        try:
            procs += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return procs


class VersionWatch:
    """Polls the service's ``GET /version``; the first time each version was named."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/version"
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as reply:
                    version = json.loads(reply.read()).get("version")
            except OSError:  # 503 before the first version, or the service starting
                continue
            if version and version not in self.first_seen:
                self.first_seen[version] = time.time()

    def stop(self) -> None:
        self._stop.set()


def _spawn(stack: ExitStack, log: Path, *cmd: str) -> subprocess.Popen:
    """A service process for the life of ``stack``, stopped with SIGTERM."""
    out = stack.enter_context(open(log, "ab"))  # noqa: SIM115 (the stack closes it)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)
    return proc


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up; see its log under the work directory")
        time.sleep(0.5)


def e2e_config(services: LocalServices, root: Path, stream_start: datetime) -> PipelineConfig:
    """The benches' config (labels in the impressions) with the live mode's passes (1 minute,
    5 s lateness) and Airflow's schedule from the stream's first window."""
    return live_config(bench_config(services, root, OURS), stream_start)


def _next(pass_id: str, minutes: int) -> str:
    return compose_pass_id(window_ms(pass_id, minutes)[1], minutes)


def start_streamrec(
    stack: ExitStack, cfg: PipelineConfig, config_path: Path, logs: Path, meter: TreeMeter
) -> VersionWatch:
    """The cluster, the pass builder, the service and Airflow, as a user starts them."""
    cluster = _spawn(
        stack, logs / "cluster.log", STREAMREC, "cluster", "--config", str(config_path)
    )
    meter.add(OURS, "cluster", cluster.pid)
    client = ClusterClient.from_config(cfg)
    _wait("the cluster", lambda: len(client.live_workers()) >= cfg.cluster.workers, cluster, 300)
    builder = _spawn(
        stack, logs / "builder.log", STREAMREC, "build-passes", "--config", str(config_path)
    )
    meter.add(OURS, "builder", builder.pid)
    port = free_port()
    serve = _spawn(
        stack,
        logs / "serve.log",
        STREAMREC,
        *("serve", "--config", str(config_path), "--port", str(port)),
    )
    meter.add(OURS, "serve", serve.pid)
    airflow = stack.enter_context(LocalAirflow(Path(cfg.paths.work_root) / "airflow", config_path))
    for proc in airflow.procs.values():
        meter.add(OURS, "airflow", proc.pid)
    watch = VersionWatch(port)
    threading.Thread(target=watch.run, name="version-watch", daemon=True).start()
    stack.callback(watch.stop)
    print(f"streamrec up; Airflow UI {airflow.url}", flush=True)
    return watch


def _read_jsonl(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return {r["pass_id"]: r for r in map(json.loads, lines)}


def ours_by_pass(cfg: PipelineConfig, passes: list[str], served: dict[str, float]) -> list[dict]:
    """Per pass: rows, and when it was complete, trained and served (epoch seconds); a pass
    never completed is left out (and shows as not served)."""
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    rows = []
    for pass_id in passes:
        status = {k: json.loads(v) for k, v in r.hgetall(keys.pass_status(pass_id)).items()}
        try:
            manifest = read_manifest(pass_dir(cfg.paths.data_root, pass_id))
        except ContractError:
            print(f"pass {pass_id} was never complete")
            continue
        train = status.get("train", {})
        rows.append(
            {
                "pass_id": pass_id,
                "rows": manifest.rows,
                "complete": datetime.fromisoformat(manifest.created_at).timestamp(),
                "started": train.get("started_at"),
                "trained": train.get("trained_at"),
                "train_s": train.get("seconds", {}).get("train"),
                "auc": train.get("test", {}).get("auc"),
                "served": served.get(pass_id),
            }
        )
    r.close()
    return rows


def _after(t: float | None, end: float) -> str:
    return f"{t - end:7.1f}" if t else f"{'-':>7}"


def report(
    cfg: PipelineConfig,
    measured: list[str],
    ours: list[dict],
    theirs: dict[str, dict],
    meter: TreeMeter,
    rate: float,
) -> None:
    """The per-pass table, both pipelines' figures side by side, the RESULT lines."""
    minutes, lateness = cfg.passes.pass_minutes, cfg.passes.allowed_lateness_seconds
    print("\nseconds after each window's end (freshness = served):")
    print(
        f"{'pass':<13}{'rows':>7} | streamrec {'complete':>8} {'trains':>7} {'trained':>7}"
        f" {'served':>7} {'AUC':>6} | reference {'rows':>6} {'job':>7} {'served':>7}"
    )
    for o in ours:
        end = window_ms(o["pass_id"], minutes)[1] / 1000
        t = theirs.get(o["pass_id"], {})
        auc = f"{o['auc']:6.3f}" if o["auc"] else f"{'-':>6}"
        print(
            f"{o['pass_id']:<13}{o['rows']:>7} | {'':9} {_after(o['complete'], end):>8}"
            f" {_after(o['started'], end)} {_after(o['trained'], end)} {_after(o['served'], end)}"
            f" {auc} | {'':9} {t.get('rows', 0):>6} {_after(t.get('started'), end)}"
            f" {_after(t.get('done'), end)}"
        )
    span = len(measured) * minutes * 60
    figures = {}
    for name, served, rows, train in (
        (
            OURS,
            [o["served"] - window_ms(o["pass_id"], minutes)[1] / 1000 for o in ours if o["served"]],
            sum(o["rows"] for o in ours),
            sum(o["train_s"] or 0 for o in ours),
        ),
        (
            REFERENCE,
            [
                theirs[p]["done"] - window_ms(p, minutes)[1] / 1000
                for p in measured
                if theirs.get(p, {}).get("done")
            ],
            sum(theirs.get(p, {}).get("rows", 0) for p in measured),
            sum(theirs.get(p, {}).get("train_s", 0) for p in measured),
        ),
    ):
        cpu = meter.between(name, "start", "done") if f"{name}/done" in meter.marks else None
        figures[name] = {
            "served": f"{len(served)}/{len(measured)}",
            "events/s trained": rows / span,
            "training samples/s": rows / train if train else 0.0,
            "freshness p50 s": statistics.median(served) if served else float("nan"),
            "freshness max s": max(served, default=float("nan")),
            "overhead p50 s": statistics.median(served) - lateness if served else float("nan"),
            "CPU s per 1k events": cpu / rows * 1000 if cpu and rows else float("nan"),
            "peak PSS MiB": meter.peak_pss.get(name, 0.0) / 2**20,
        }
    print(f"\nmeasured: {len(measured)} one-minute passes, stream {rate:g} impressions/s")
    print(f"  {'':<22}{OURS:>12}{REFERENCE:>12}")
    for key, value in figures[OURS].items():
        other = figures[REFERENCE][key]
        fmt = (lambda v: f"{v:12}") if isinstance(value, str) else (lambda v: f"{v:12.2f}")
        print(f"  {key:<22}{fmt(value)}{fmt(other)}")
    if f"{OURS}/done" in meter.marks:
        rows = sum(o["rows"] for o in ours) / 1000
        shares = ", ".join(
            f"{key.split(':')[1]} {meter.between(key, 'start', 'done') / rows:.2f}"
            for key in meter.cpu
            if key.startswith(f"{OURS}:")
        )
        print(f"  {OURS} CPU s per 1k events by part: {shares}")
    print(
        f"  shared: broker {meter.cpu.get(SHARED, 0):.0f} CPU s,"
        f" peak {meter.peak_pss.get(SHARED, 0) / 2**20:.0f} MiB"
    )
    ours_p50 = figures[OURS]["freshness p50 s"]
    print(f"RESULT freshness_p50_s {ours_p50:.1f}")
    print(f"RESULT overhead_p50_s {figures[OURS]['overhead p50 s']:.1f}")
    print(f"RESULT freshness_ratio {ours_p50 / figures[REFERENCE]['freshness p50 s']:.2f}")


def run(rate: float, passes: int, root: Path) -> None:
    logs = root / "logs"
    logs.mkdir()
    with ExitStack() as stack:
        services = stack.enter_context(local_services(root / "services"))
        meter = TreeMeter()
        for child in psutil.Process().children():  # the broker and redis-server
            if "redis" in child.name():
                meter.add(OURS, "redis", child.pid)
            else:
                meter.add(SHARED, "broker", child.pid)
        stream_start = datetime.now(UTC)
        cfg = e2e_config(services, root, stream_start)
        config_path = dump_config(cfg, root / OURS / "pipeline.yaml")
        minutes = cfg.passes.pass_minutes
        warmup = _next(compose_pass_id(int(stream_start.timestamp() * 1000), minutes), minutes)
        measured = [_next(warmup, minutes)]
        while len(measured) < passes:
            measured.append(_next(measured[-1], minutes))

        stop_stream = threading.Event()
        producer = threading.Thread(
            target=produce_live, args=(cfg, rate, stop_stream), name="stream", daemon=True
        )
        producer.start()
        stack.callback(producer.join, 30)
        stack.callback(stop_stream.set)
        print(
            f"stream from {stream_start:%H:%M:%S}; warm-up pass {warmup},"
            f" measured {measured[0]}..{measured[-1]}",
            flush=True,
        )
        ref_root = root / REFERENCE
        ref_root.mkdir()
        reference = _spawn(
            stack,
            logs / "reference.log",
            sys.executable,
            str(REPO / "bench" / "reference_pipeline.py"),
            *("--config", str(config_path), "--root", str(ref_root), "--first", warmup),
            *("--passes", str(passes + 1)),
        )
        meter.add(REFERENCE, "consumer and jobs", reference.pid)
        watch = start_streamrec(stack, cfg, config_path, logs, meter)
        threading.Thread(target=meter.run, name="meter", daemon=True).start()
        stack.callback(meter.stop)

        late_s = time.time() - window_ms(measured[0], minutes)[0] / 1000
        if late_s > 0:  # the warm-up pass would not be one: measured passes would catch up
            raise SystemExit(f"start-up ran {late_s:.0f}s into the first measured window")
        time.sleep(-late_s)
        for group in (OURS, REFERENCE):
            meter.mark(group, "start")
        last, ref_file = measured[-1], ref_root / "passes.jsonl"
        deadline = window_ms(last, minutes)[1] / 1000 + 600
        while time.time() < deadline:
            theirs = _read_jsonl(ref_file)
            if last in watch.first_seen and f"{OURS}/done" not in meter.marks:
                meter.mark(OURS, "done")
            if last in theirs and f"{REFERENCE}/done" not in meter.marks:
                meter.mark(REFERENCE, "done")
            if f"{OURS}/done" in meter.marks and f"{REFERENCE}/done" in meter.marks:
                break
            if reference.poll() is not None and last not in theirs:
                raise SystemExit(f"the reference pipeline failed; see {logs / 'reference.log'}")
            print(
                f"\r  {datetime.now(UTC):%H:%M:%S} streamrec serves"
                f" {max(list(watch.first_seen), default='-')}, reference exported"
                f" {max(theirs, default='-')}",
                end="",
                flush=True,
            )
            time.sleep(2)
        print()
        ours = ours_by_pass(cfg, measured, watch.first_seen)
        report(cfg, measured, ours, _read_jsonl(ref_file), meter, rate)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=200, help="impressions per second")
    parser.add_argument("--passes", type=int, default=10, help="measured one-minute passes")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args()
    print(f"hardware: {hardware_line()}", flush=True)
    if args.keep:
        args.keep.mkdir(parents=True)
        run(args.rate, args.passes, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(args.rate, args.passes, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
