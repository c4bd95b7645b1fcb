"""Freshness of the whole pipeline against the doc-style reference, on one live stream.

A live synthetic stream (``--rate`` impressions/s, Poisson arrivals, labels in the
impressions) goes to the embedded broker; passes are one minute (``--pass-seconds``) with
5 s allowed lateness (``--lateness``, both pipelines).
On the same events, in the same run:

- **streamrec** as a user runs it: ``streamrec build-passes``, ``streamrec cluster`` (as
  shipped, its pass follower trains, judges and delivers each pass; ``--follow-passes off``
  leaves each pass to its DAG run's tasks), Airflow's real api-server, scheduler and
  dag-processor running dags/streamrec_pass.py, and ``streamrec serve``, whose
  ``GET /version`` this script polls every 0.05 s: a pass is served when /version first
  names it.
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

    .venv/bin/python bench/e2e.py [--rate 200] [--passes 10] [--pass-seconds 60] [--lateness 5]
                                  [--join click_join [--label-window 10]]
    .venv/bin/python bench/e2e.py --sweep 500,2000,5000,10000,20000 [--passes 3]

``--join click_join``: the click comes on its own topic, within ``--label-window`` seconds
of its impression (the live demo's clicks come 3 s after it on average). Ours trains each
impression at once as a negative and each click as a positive duplicate when it comes
(``emit: at_once``); the reference joins before it writes, holding each window until its
end plus the label window plus the lateness. Per event is then reported for each
impression and for each click (over the clicks whose impression and click both fall in
the measured windows, the same for both pipelines).

``--pass-seconds`` sets ``passes.pass_seconds`` for both (the reference cuts the same
windows). The warm-up pass is the first window starting ``START_UP_S`` after the stream, so
that both pipelines are up before it even with 15-second windows.

Ends with ``RESULT freshness_p50_s``, ``overhead_p50_s`` (streamrec's),
``freshness_ratio`` (streamrec's p50 over the reference's) and ``event_to_served_p50_s``
and ``_p99_s`` for both (the reference's ending ``_reference``); with ``--join
click_join`` each name ends ``_click_join`` (before ``_reference``), with
``click_to_served_p50_s`` and ``_p99_s`` beside them.

**The sweep** runs each pipeline alone at each rate, from the lowest, on fresh services
each time: the machine to itself with the producer and the broker, which is the ceiling a
team sizing hardware needs. On one stream the two would measure each other's load: at
12,500/s the producer (0.56 core, measured alone), the broker and both pipelines (0.07-0.08
CPU s per 1k events each) ask for more than 2 cores. A rate is **sustained** when every
measured pass is served, every impression sent in its window (the producer counts them)
is trained, the passes are not served later and later after their windows (by more than
``BEHIND_STEP_S`` at every step and ``BEHIND_SLACK_S`` in all: a trend, not one pass's
jitter), and freshness p50 is under a minute. A pipeline that does not sustain a rate
runs no higher one. It prints a side-by-side table per rate (events/s trained, freshness
p50 and max, the lag of each stage, CPU per 1k events, peak PSS), draws events trained
and freshness against the offered rate to ``--out``, and ends with ``RESULT
max_rate_eps`` (streamrec's highest sustained rate) and ``RESULT max_rate_ratio`` (over
the reference's). Freshness alone would reward a pipeline that drops what arrives after
its cut; this counts the loss.
"""

from __future__ import annotations

import argparse
import itertools
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from machine import hardware_line
from pipeline import REPO, STREAMREC, bench_config

from demo.live import LATENESS_SECONDS, live_config
from devservices.local_services import LocalServices, local_services
from ops.airflow_local import LocalAirflow
from ops.charts import ReferenceLine, Series, YRange, chart_page, line_chart
from streaming.producer import produce_live
from streaming.windows import WindowCutter
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.contracts.pass_status import read_statuses
from streamrec.errors import ContractError
from streamrec.passes import pass_dir, read_manifest
from streamrec.ports import free_port
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import ClusterClient

OURS, REFERENCE, SHARED = "streamrec", "reference", "broker"
IMPRESSION, CLICK_JOIN = "label_in_impression", "click_join"  # --join: where labels come from
# click_join's label window: the live demo's (its clicks come 3 s after their impression on
# average); the reference waits it out before each window's job
LABEL_WINDOW_S = 10
MAX_FRESHNESS_P50_S = 60.0  # a rate is sustained only with freshness p50 under this
# falling behind: every pass later after its window than the one before it by more than
# BEHIND_STEP_S, the last more than BEHIND_SLACK_S later than the first. The lag from
# trained to served varies by ~7 s from pass to pass at 10,000 events/s (7.8, 12.5, 14.6 s
# in one run) with nothing queued: one pass's jump is jitter, a growth at every step is not
BEHIND_STEP_S = 2.0
# the warm-up pass is the first window starting this long after the stream: both pipelines
# are up by then (26 s measured with 15-second windows, whose next window began too soon)
START_UP_S = 45
BEHIND_SLACK_S = 6.0
# the producer sends what happened every this often: a real one sends each event as it
# happens (kafka-python's linger_ms 0). At 0.5 s (produce_live's default) an event waited
# 0.25 s on average before it was sent, and a window was complete only at the first send
# after its end plus the lateness: an event-time watermark paid up to 0.5 s that the
# reference, which closes its windows by the wall clock, did not
PRODUCER_TICK_S = 0.1


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


POLL_S = 0.05  # at 0.2 s the poll alone added 0.1 s on average to every served time


class VersionWatch:
    """Polls the service's ``GET /version``; the first time each version was named."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/version"
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(POLL_S):
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


def e2e_config(
    services: LocalServices,
    root: Path,
    stream_start: datetime,
    pass_seconds: int = 60,
    join: str = IMPRESSION,
    label_window_s: int = LABEL_WINDOW_S,
    lateness_s: int = LATENESS_SECONDS,
) -> PipelineConfig:
    """The benches' config with the live mode's passes (``pass_seconds``, ``lateness_s``
    allowed lateness, a click 3 s after its impression on average) and Airflow's schedule
    from the stream's first window. ``join``: labels in the impressions, or
    ``click_join``: the click joined from its own topic within ``label_window_s``, each
    impression trained at once as a negative and each click as a positive duplicate when it
    comes (``emit: at_once``, the delay corrected in the loss), as a team after freshness
    would run it."""
    cfg = live_config(bench_config(services, root, OURS), stream_start, pass_seconds)
    if lateness_s != cfg.passes.allowed_lateness_seconds:
        cfg = derived(cfg, "--lateness", passes={"allowed_lateness_seconds": lateness_s})
    if join == IMPRESSION:
        return cfg
    schema = cfg.model_dump(mode="json", by_alias=True)["schema"]
    (click,) = schema["labels"]
    joined = {"topic": f"clicks-{OURS}", "window_seconds": label_window_s, "emit": "at_once"}
    click = {**click, "source": "topic", **joined}
    return derived(cfg, "the click-join bench", schema={**schema, "labels": [click]})


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
    """Per pass: rows trained, the impressions and clicks among them, and when it was
    complete, trained and served (epoch seconds); a pass never completed is left out (and
    shows as not served)."""
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    rows = []
    for status in read_statuses(r, keys, passes):
        pass_id = status.pass_id
        try:
            manifest = read_manifest(pass_dir(cfg.paths.data_root, pass_id))
        except ContractError:
            print(f"pass {pass_id} was never complete")
            continue
        train = status.train
        click = manifest.counts.labels.get("click")
        fresh = bool(cfg.feature_schema.fresh_labels) and click is not None
        rows.append(
            {
                "pass_id": pass_id,
                "rows": manifest.rows,
                # with the click at_once: its observed rows, one per impression, and a
                # duplicate per click (the clicks counted per event); else a row each
                "impressions": click.observed if fresh else manifest.rows,
                "clicks": click.duplicates if fresh else 0,
                "complete": datetime.fromisoformat(manifest.created_at).timestamp(),
                "started": train.started_at if train else None,
                "trained": train.trained_at if train else None,
                # the training reads of the pass's command and of its steps, if any
                "train_s": (
                    train.seconds.get("train", 0.0) + train.seconds_in_steps.get("train", 0.0)
                    if train
                    else None
                ),
                "auc": train.test.auc if train else None,
                "served": served.get(pass_id),
            }
        )
    r.close()
    return rows


def _after(t: float | None, end: float) -> str:
    return f"{t - end:7.1f}" if t else f"{'-':>7}"


@dataclass
class Outcome:
    """One pipeline at one rate: its figures, and whether it sustained the rate."""

    figures: dict[str, Any]
    sustained: bool
    why: str  # what broke it, or "" when sustained


def _verdict(lags: list[float | None], trained: list[int], sent: list[int]) -> tuple[bool, str]:
    """Sustained: every measured pass served with every event sent in its window trained,
    the passes not falling further behind pass after pass (``BEHIND_STEP_S``,
    ``BEHIND_SLACK_S``), and freshness p50 under ``MAX_FRESHNESS_P50_S``."""
    if any(lag is None for lag in lags):
        return False, f"{sum(lag is None for lag in lags)} of {len(lags)} passes not served"
    lost = sum(sent) - sum(trained)
    if any(t < n for t, n in zip(trained, sent, strict=True)):
        return False, f"{lost} of {sum(sent)} events not trained"
    served = [lag for lag in lags if lag is not None]
    steps = [b - a for a, b in itertools.pairwise(served)]
    if steps and min(steps) > BEHIND_STEP_S and served[-1] - served[0] > BEHIND_SLACK_S:
        later = ", ".join(f"{lag:.0f}" for lag in served)
        return False, f"falling behind: served {later} s after their windows"
    if statistics.median(served) >= MAX_FRESHNESS_P50_S:
        return False, f"freshness p50 {statistics.median(served):.0f} s"
    return True, ""


@dataclass(frozen=True)
class Observed:
    """What one run at one rate saw: the measured passes, each pipeline's per-pass record
    (None: it did not run), the impressions sent per window, and the processes' meter."""

    cfg: PipelineConfig
    rate: float
    measured: list[str]
    ours: list[dict] | None
    theirs: dict[str, dict] | None
    sent_times: dict[str, list[np.ndarray]]  # window -> event times (epoch ms) sent in it
    meter: TreeMeter
    # click_join: (impression time, click time) of each click within its window (epoch ms)
    clicks: np.ndarray = field(default_factory=lambda: np.empty((0, 2), np.int64))

    @property
    def sent(self) -> dict[str, int]:
        """Impressions sent per window."""
        return {w: sum(len(a) for a in times) for w, times in dict(self.sent_times).items()}


def event_to_served(
    sent_times: dict[str, list[np.ndarray]], rows: dict[str, tuple[int, float | None]]
) -> np.ndarray:
    """Seconds from each impression sent in the measured windows to the first moment a
    version that trained it served: per window, the version's serving time less each
    event's time. ``rows``: window -> (rows trained, serving time or None). Events a
    pipeline did not train (fewer rows than sent) or whose pass never served are infinite:
    a pipeline that drops events cannot come out fresher for it."""
    seconds = []
    for window, (trained, served) in rows.items():
        times = np.concatenate(sent_times.get(window, [np.empty(0, np.int64)])) / 1000
        if served is None:
            seconds.append(np.full(len(times), np.inf))
            continue
        lost = max(len(times) - trained, 0)
        seconds += [served - times, np.full(lost, np.inf)]
    return np.concatenate(seconds) if seconds else np.empty(0)


def summarize(seen: Observed) -> dict[str, Outcome]:
    """Each pipeline that ran: its figures and its verdict."""
    cfg, measured, ours, theirs, sent, meter = (
        seen.cfg, seen.measured, seen.ours, seen.theirs, seen.sent, seen.meter
    )  # fmt: skip
    clock, lateness = cfg.passes.clock, cfg.passes.allowed_lateness_seconds
    span = len(measured) * clock.seconds
    end = {p: clock.window(p)[1] / 1000 for p in measured}
    per_pass: dict[str, list[dict]] = {}
    if ours is not None:
        by = {o["pass_id"]: o for o in ours}
        per_pass[OURS] = [
            {
                "rows": by.get(p, {}).get("rows", 0),
                "impressions": by.get(p, {}).get("impressions", 0),
                "clicks": by.get(p, {}).get("clicks", 0),
                "served": by.get(p, {}).get("served"),
                "train_s": by.get(p, {}).get("train_s") or 0.0,
                **{k: by.get(p, {}).get(k) for k in ("complete", "started", "trained")},
            }
            for p in measured
        ]
    if theirs is not None:
        per_pass[REFERENCE] = [
            {
                "rows": theirs.get(p, {}).get("rows", 0),
                "impressions": theirs.get(p, {}).get("rows", 0),
                "clicks": theirs.get(p, {}).get("positives", 0),
                "served": theirs.get(p, {}).get("done"),
                "train_s": theirs.get(p, {}).get("train_s", 0.0),
                "started": theirs.get(p, {}).get("started"),
            }
            for p in measured
        ]
    outcomes = {}
    for name, rows in per_pass.items():
        lags = [
            r["served"] - end[p] if r["served"] else None
            for p, r in zip(measured, rows, strict=True)
        ]
        served = [lag for lag in lags if lag is not None]
        trained = sum(r["rows"] for r in rows)
        train_s = sum(r["train_s"] for r in rows)
        cpu = meter.between(name, "start", "done") if f"{name}/done" in meter.marks else None
        figures: dict[str, Any] = {
            "served": f"{len(served)}/{len(measured)}",
            "events sent": sum(sent.get(p, 0) for p in measured),
            "events/s trained": trained / span,
            "training samples/s": trained / train_s if train_s else 0.0,
            "freshness p50 s": statistics.median(served) if served else float("nan"),
            "freshness max s": max(served, default=float("nan")),
            "overhead p50 s": statistics.median(served) - lateness if served else float("nan"),
            **_event_figures(seen.sent_times, measured, rows),
            **_click_figures(seen, name, rows),
            "CPU s per 1k events": cpu / trained * 1000 if cpu and trained else float("nan"),
            "peak PSS MiB": meter.peak_pss.get(name, 0.0) / 2**20,
        }
        for stage in ("complete", "started", "trained"):
            times = [r[stage] - end[p] for p, r in zip(measured, rows, strict=True) if r.get(stage)]
            if times:
                figures[f"{stage} p50 s"] = statistics.median(times)
        if cpu and trained:
            for key in meter.cpu:
                if key.startswith(f"{name}:"):
                    part = meter.between(key, "start", "done") / trained * 1000
                    figures[f"CPU/1k {key.split(':')[1]}"] = part
        ok, why = _verdict(
            lags, [r["impressions"] for r in rows], [sent.get(p, 0) for p in measured]
        )
        if ok and figures.get("clicks lost"):
            ok, why = False, f"{figures['clicks lost']} clicks not trained"
        outcomes[name] = Outcome(figures, ok, why)
    return outcomes


def _event_figures(
    sent_times: dict[str, list[np.ndarray]], measured: list[str], rows: list[dict]
) -> dict[str, float]:
    """p50 and p99 of ``event_to_served`` over the measured windows."""
    per_window = {p: (r["impressions"], r["served"]) for p, r in zip(measured, rows, strict=True)}
    return _quantiles("event", event_to_served(sent_times, per_window))


def _click_figures(seen: Observed, name: str, rows: list[dict]) -> dict[str, float]:
    """click_join: p50 and p99 of ``event_to_served`` over the clicks whose impression and
    click both fall in the measured windows (the same clicks for both pipelines). Ours
    trains a click in the pass of its own time, the reference in its impression's."""
    if not len(seen.clicks):
        return {}
    clock, measured = seen.cfg.passes.clock, seen.measured
    first, last = clock.window(measured[0])[0], clock.window(measured[-1])[1]
    inside = seen.clicks[(seen.clicks >= first).all(axis=1) & (seen.clicks < last).all(axis=1)]
    by = np.array(WindowCutter(clock).pass_ids_of(inside[:, 0 if name == REFERENCE else 1]))
    click_times = {p: [inside[by == p, 1]] for p in measured}
    per_window = {p: (r["clicks"], r["served"]) for p, r in zip(measured, rows, strict=True)}
    seconds = event_to_served(click_times, per_window)
    lost = sum(max(len(click_times[p][0]) - n, 0) for p, (n, _) in per_window.items())
    return {**_quantiles("click", seconds), "clicks lost": lost}


def _quantiles(what: str, seconds: np.ndarray) -> dict[str, float]:
    if not len(seconds):
        return {}
    # quantiles that are events' own figures: an infinite one is not interpolated into NaN
    p50, p99 = np.quantile(seconds, [0.5, 0.99], method="inverted_cdf")
    return {f"{what} to served p50 s": float(p50), f"{what} to served p99 s": float(p99)}


def print_run(seen: Observed, outcomes: dict[str, Outcome]) -> None:
    """The per-pass table and the pipelines' figures side by side."""
    measured, ours, theirs, meter = seen.measured, seen.ours, seen.theirs, seen.meter
    clock = seen.cfg.passes.clock
    print("\nseconds after each window's end (freshness = served):")
    print(
        f"{'pass':<13}{'rows':>7} | streamrec {'complete':>8} {'trains':>7} {'trained':>7}"
        f" {'served':>7} {'AUC':>6} | reference {'rows':>6} {'job':>7} {'served':>7}"
    )
    by = {o["pass_id"]: o for o in ours or []}
    for pass_id in measured:
        end = clock.window(pass_id)[1] / 1000
        o, t = by.get(pass_id, {}), (theirs or {}).get(pass_id, {})
        auc = f"{o['auc']:6.3f}" if o.get("auc") else f"{'-':>6}"
        print(
            f"{pass_id:<13}{o.get('rows', 0):>7} | {'':9} {_after(o.get('complete'), end):>8}"
            f" {_after(o.get('started'), end)} {_after(o.get('trained'), end)}"
            f" {_after(o.get('served'), end)} {auc} | {'':9} {t.get('rows', 0):>6}"
            f" {_after(t.get('started'), end)} {_after(t.get('done'), end)}"
        )
    seconds = seen.cfg.passes.clock.seconds
    joined = [x for x in seen.cfg.topic_labels if x.name == "click"]
    labels = (
        f"clicks joined within {joined[0].window_seconds} s, ours at once"
        if joined
        else "labels in the impressions"
    )
    print(
        f"\nmeasured: {len(measured)} passes of {seconds} s, stream {seen.rate:g} impressions/s,"
        f" {labels}"
    )
    names = list(outcomes)
    print(f"  {'':<24}" + "".join(f"{n:>12}" for n in names))
    keys = list(dict.fromkeys(k for o in outcomes.values() for k in o.figures))
    for key in keys:
        cells = []
        for n in names:
            v = outcomes[n].figures.get(key)
            cells.append(
                f"{'-':>12}"
                if v is None
                else f"{v:>12}"
                if isinstance(v, str | int)
                else f"{v:12.2f}"
            )
        print(f"  {key:<24}" + "".join(cells))
    for n, o in outcomes.items():
        print(f"  {n}: {'sustained' if o.sustained else 'not sustained: ' + o.why}")
    print(
        f"  shared: broker {meter.cpu.get(SHARED, 0):.0f} CPU s,"
        f" peak {meter.peak_pss.get(SHARED, 0) / 2**20:.0f} MiB"
    )


def run(
    rate: float,
    passes: int,
    root: Path,
    pipelines: tuple[str, ...] = (OURS, REFERENCE),
    follow: bool | None = None,
    pass_seconds: int = 60,
    join: str = IMPRESSION,
    label_window_s: int = LABEL_WINDOW_S,
    lateness_s: int = LATENESS_SECONDS,
    step_seconds: int | None = None,
) -> dict[str, Outcome]:
    """Both pipelines (or those named) on one live stream of ``rate`` impressions/s, in
    passes of ``pass_seconds``, labels as ``join`` says (``e2e_config``); with ``follow``,
    ``cluster.follow_passes`` set so (None: as shipped); ``step_seconds``: ours trains
    each pass in steps of that many seconds as its window fills."""
    logs = root / "logs"
    logs.mkdir(parents=True)
    with ExitStack() as stack:
        services = stack.enter_context(local_services(root / "services"))
        meter = TreeMeter()
        for child in psutil.Process().children():  # the broker and redis-server
            if "redis" in child.name():
                meter.add(OURS, "redis", child.pid)
            else:
                meter.add(SHARED, "broker", child.pid)
        stream_start = datetime.now(UTC)
        cfg = e2e_config(
            services, root, stream_start, pass_seconds, join, label_window_s, lateness_s
        )
        if follow is not None:
            cfg = derived(cfg, "--follow-passes", cluster={"follow_passes": follow})
        if step_seconds:
            steps = {"step_seconds": step_seconds, "join_memory_mib": None}
            cfg = derived(cfg, "--step-seconds", passes=steps)
        print(f"cluster.follow_passes: {cfg.cluster.follow_passes}", flush=True)
        config_path = dump_config(cfg, root / OURS / "pipeline.yaml")
        clock = cfg.passes.clock
        warmup = clock.next(clock.id_of(stream_start + timedelta(seconds=START_UP_S)))
        measured = [clock.next(warmup)]
        while len(measured) < passes:
            measured.append(clock.next(measured[-1]))

        stop_stream = threading.Event()
        sent: dict[str, list[np.ndarray]] = {}
        labels: dict[str, list[np.ndarray]] = {}
        producer = threading.Thread(
            target=produce_live,
            args=(cfg, rate, stop_stream),
            kwargs={"sent_times": sent, "label_times": labels, "tick_s": PRODUCER_TICK_S},
            name="stream",
            daemon=True,
        )
        producer.start()
        stack.callback(producer.join, 30)
        stack.callback(stop_stream.set)
        print(
            f"stream of {rate:g}/s from {stream_start:%H:%M:%S} for {', '.join(pipelines)}; "
            f"warm-up pass {warmup}, measured {measured[0]}..{measured[-1]}",
            flush=True,
        )
        ref_root, reference = root / REFERENCE, None
        if REFERENCE in pipelines:
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
        watch = start_streamrec(stack, cfg, config_path, logs, meter) if OURS in pipelines else None
        threading.Thread(target=meter.run, name="meter", daemon=True).start()
        stack.callback(meter.stop)

        late_s = time.time() - clock.window(measured[0])[0] / 1000
        if late_s > 0:  # the warm-up pass would not be one: measured passes would catch up
            raise SystemExit(f"start-up ran {late_s:.0f}s into the first measured window")
        time.sleep(-late_s)
        for group in pipelines:
            meter.mark(group, "start")
        last, ref_file = measured[-1], ref_root / "passes.jsonl"
        # a pipeline that has not served the last pass by then has fallen behind for good
        deadline = clock.window(last)[1] / 1000 + MAX_FRESHNESS_P50_S * 3
        while time.time() < deadline:
            theirs = _read_jsonl(ref_file)
            if watch and last in watch.first_seen and f"{OURS}/done" not in meter.marks:
                meter.mark(OURS, "done")
            if reference and last in theirs and f"{REFERENCE}/done" not in meter.marks:
                meter.mark(REFERENCE, "done")
            if all(f"{g}/done" in meter.marks for g in pipelines):
                break
            if reference and reference.poll() is not None and last not in theirs:
                raise SystemExit(f"the reference pipeline failed; see {logs / 'reference.log'}")
            print(
                f"\r  {datetime.now(UTC):%H:%M:%S} streamrec serves"
                f" {max(list(watch.first_seen) if watch else [], default='-')}, reference"
                f" exported {max(theirs, default='-')}",
                end="",
                flush=True,
            )
            time.sleep(2)
        print()
        for group in pipelines:  # a pipeline that fell behind: its CPU up to now
            if f"{group}/done" not in meter.marks:
                meter.mark(group, "done")
        ours = ours_by_pass(cfg, measured, watch.first_seen) if watch else None
        theirs = _read_jsonl(ref_file) if reference else None
        clicks = np.concatenate([np.empty((0, 2), np.int64), *list(labels.get("click", []))])
        observed = Observed(cfg, rate, measured, ours, theirs, sent, meter, clicks)
        outcomes = summarize(observed)
        print_run(observed, outcomes)
        return outcomes


def sweep(
    rates: list[float],
    passes: int,
    root: Path,
    out: Path,
    pass_seconds: int = 60,
    lateness_s: int = LATENESS_SECONDS,
    step_seconds: int | None = None,
) -> None:
    """``run`` of each pipeline alone at each rate, fresh services each time; a pipeline
    that does not sustain a rate runs no higher one. The side-by-side table, the charts,
    the RESULT lines."""
    active = [OURS, REFERENCE]
    results: dict[float, dict[str, Outcome]] = {}
    for rate in rates:
        if not active:
            break
        results[rate] = {}
        for name in active:
            results[rate] |= run(
                rate,
                passes,
                root / f"rate-{rate:g}-{name}",
                (name,),
                pass_seconds=pass_seconds,
                lateness_s=lateness_s,
                step_seconds=step_seconds,
            )
        active = [n for n in active if results[rate][n].sustained]
    columns = [
        ("events/s trained", "{:.0f}"),
        ("freshness p50 s", "{:.1f}"),
        ("freshness max s", "{:.1f}"),
        ("complete p50 s", "{:.1f}"),
        ("started p50 s", "{:.1f}"),
        ("trained p50 s", "{:.1f}"),
        ("CPU s per 1k events", "{:.2f}"),
        ("peak PSS MiB", "{:.0f}"),
    ]
    print("\nthe sweep: per rate, each pipeline (lags in seconds after the window's end)")
    print(
        f"{'rate':>7} {'pipeline':<10}" + "".join(f"{c[:16]:>17}" for c, _ in columns) + "  verdict"
    )
    for rate, outcomes in results.items():
        for name, o in outcomes.items():
            cells = [fmt.format(o.figures[c]) if c in o.figures else "-" for c, fmt in columns]
            verdict = "sustained" if o.sustained else o.why
            print(f"{rate:>7g} {name:<10}" + "".join(f"{c:>17}" for c in cells) + f"  {verdict}")
        parts = {
            k: v
            for k, v in outcomes.get(OURS, Outcome({}, False, "")).figures.items()
            if k.startswith("CPU/1k ")
        }
        if parts:
            print(
                f"{'':>18}streamrec CPU s per 1k events by part: "
                + ", ".join(f"{k[7:]} {v:.2f}" for k, v in parts.items())
            )

    def ceiling(name: str) -> float:
        return max((r for r, o in results.items() if name in o and o[name].sustained), default=0.0)

    ours, theirs = ceiling(OURS), ceiling(REFERENCE)
    print(
        f"highest rate sustained (every event trained, not falling behind, freshness p50 under "
        f"{MAX_FRESHNESS_P50_S:.0f} s): streamrec {ours:g}/s, reference {theirs:g}/s"
    )
    x = list(results)

    def series(name: str, key: str) -> Series:
        return Series(
            name, [results[r][name].figures.get(key) if name in results[r] else None for r in x]
        )

    charts = [
        line_chart(
            "sweep-trained",
            "Events trained per second",
            x,
            [
                series(OURS, "events/s trained"),
                series(REFERENCE, "events/s trained"),
                Series("offered", x),
            ],
            x_label="offered impressions/s",
            y_label="events/s trained",
            y_range=YRange(floor=0.0),
            x_scale="log",
        ),
        line_chart(
            "sweep-freshness",
            "Freshness p50 (serving time - window end)",
            x,
            [series(OURS, "freshness p50 s"), series(REFERENCE, "freshness p50 s")],
            x_label="offered impressions/s",
            y_label="seconds",
            references=[ReferenceLine(MAX_FRESHNESS_P50_S, "sustained below")],
            y_range=YRange(floor=0.0),
            x_scale="log",
        ),
    ]
    out.write_text(chart_page("bench/e2e.py: the rate sweep", charts, hardware_line()))
    print(f"charts: {out}")
    print(f"RESULT max_rate_eps {ours:g}")
    # neither sustaining the lowest rate leaves no ratio to give
    ratio = ours / theirs if theirs else (float("inf") if ours else float("nan"))
    print(f"RESULT max_rate_ratio {ratio:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=200, help="impressions per second")
    parser.add_argument("--passes", type=int, default=10, help="measured passes")
    parser.add_argument(
        "--pass-seconds", type=int, default=60, help="passes.pass_seconds (10-30, or minutes)"
    )
    parser.add_argument(
        "--lateness",
        type=int,
        default=LATENESS_SECONDS,
        help="passes.allowed_lateness_seconds for both (the live mode's 5 s by default)",
    )
    parser.add_argument(
        "--step-seconds",
        type=int,
        help="passes.step_seconds for ours: each pass trained in steps as its window fills",
    )
    parser.add_argument(
        "--sweep", help="comma-separated rates, e.g. 500,2000,5000,10000,20000: the ceilings"
    )
    parser.add_argument(
        "--follow-passes",
        choices=("on", "off"),
        help="set cluster.follow_passes (default: as the shipped config has it)",
    )
    parser.add_argument(
        "--join",
        choices=(IMPRESSION, CLICK_JOIN),
        default=IMPRESSION,
        help="labels in the impressions, or the click joined from its own topic",
    )
    parser.add_argument(
        "--label-window",
        type=int,
        default=LABEL_WINDOW_S,
        help="--join click_join: seconds a click may come after its impression",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-e2e-sweep.html"))
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args()
    print(f"hardware: {hardware_line()}", flush=True)
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True)
            root = args.keep
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.sweep:
            rates = sorted(float(r) for r in args.sweep.split(","))
            sweep(
                rates,
                *(args.passes, root, args.out.resolve(), args.pass_seconds, args.lateness),
                step_seconds=args.step_seconds,
            )
            return 0
        follow = None if args.follow_passes is None else args.follow_passes == "on"
        outcomes = run(
            args.rate,
            args.passes,
            root,
            follow=follow,
            pass_seconds=args.pass_seconds,
            join=args.join,
            label_window_s=args.label_window,
            lateness_s=args.lateness,
            step_seconds=args.step_seconds,
        )
    ours, theirs = outcomes[OURS].figures, outcomes[REFERENCE].figures
    mode = "" if args.join == IMPRESSION else f"_{args.join}"
    print(f"RESULT freshness_p50_s{mode} {ours['freshness p50 s']:.1f}")
    print(f"RESULT overhead_p50_s{mode} {ours['overhead p50 s']:.1f}")
    ratio = ours["freshness p50 s"] / theirs["freshness p50 s"]
    print(f"RESULT freshness_ratio{mode} {ratio:.2f}")
    events = ("event", "click") if args.join == CLICK_JOIN else ("event",)
    for name, figures in ((OURS, ours), (REFERENCE, theirs)):
        suffix = mode if name == OURS else f"{mode}_{name}"
        for what, q in itertools.product(events, ("p50", "p99")):
            value = figures[f"{what} to served {q} s"]
            print(f"RESULT {what}_to_served_{q}_s{suffix} {value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
