"""The real Airflow scheduler watches a cluster that follows a live stream of 15-second
passes (no ``dag.test()``).

``LiveStack`` is the live mode (``streamrec demo --live``): a live synthetic stream, the
pass builder, a fleetrun cluster (1 server + 2 workers) whose pass follower
(``cluster.follow_passes``) trains, judges and delivers each pass the moment it is
complete, and Airflow's own ``api-server``, ``scheduler`` and ``dag-processor`` processes
(LocalExecutor), whose DAG runs watch each pass. The DAG is unpaused before the stream
begins, from a schedule start before it, as a new user's would be. The tests run it for
five minutes of 15-second passes and read what the cluster and the scheduler's runs left
behind; the operator CLI is run as a user runs it, as a subprocess.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from browser import open_page
from killed_writer import killed_writer
from prometheus_client.parser import text_string_to_metric_families
from serve_process import Service
from train_runs import train_runs

from demo.live import LiveStack
from ops.report import X_LABEL, plots
from ops.status import PassRow, pass_finished, stale_after_seconds
from serving_export.delivery import registry_for
from streamrec.config import derived
from streamrec.passes import complete_passes, pass_dir
from trainers.control_plane import ClusterClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLI = str(Path(sys.executable).with_name("streamrec"))
PASS_SECONDS = 15
RUN_SECONDS = 300  # five minutes of passes
OUTAGE_WINDOWS = 2
GATE_METRIC = "streamrec_serving_gate_auc"
CLICK_WINDOW_S = 20  # the live stream's clicks come 3 s after their impression on average


def _wait(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _trained_in_order(stack: LiveStack) -> list[str]:
    """Passes whose train command is done, in the order the cluster began training them
    (retention has removed the checkpoints of the oldest)."""
    starts = _starts(stack)
    return sorted(starts, key=starts.get)


def _starts(stack: LiveStack) -> dict[str, float]:
    """When the cluster began training each pass it trained."""
    return {p: results[0]["started_at"] for p, results in train_runs(stack.cfg).items()}


def _status(stack: LiveStack, limit: int = 20) -> tuple[int, list[PassRow], dict[str, Any]]:
    out = subprocess.run(
        [CLI, "status", "--json", "--limit", str(limit), "--config", str(stack.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 5), out.stderr[-2000:]
    data = json.loads(out.stdout)
    return out.returncode, [PassRow(**row) for row in data["passes"]], data["serving"]


def _leftovers(stack: LiveStack) -> dict[str, bool]:
    """The writers' temporaries `streamrec status` counts: path -> whether its writer is gone."""
    out = subprocess.run(
        [CLI, "status", "--json", "--config", str(stack.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 5), out.stderr[-2000:]
    found = json.loads(out.stdout)["leftovers"]["leftovers"]
    return {x["path"]: x["writer_gone"] for x in found}


@pytest.fixture(scope="module")
def live(make_config) -> Iterator[LiveStack]:
    """The live stack on the shipped pipeline, its click written at once (``emit:
    at_once``, a 20 s window): every pass is judged twice, fresh and a pass later matured.
    The soak's pipeline (labels in the impression) takes the same scheduler through the gate
    on progressive metrics."""
    cfg = make_config(gate={"max_auc_drop": 0.05})  # later passes vary by ~0.01 on 18k rows
    click = {
        "name": "click",
        "source": "topic",
        "topic": cfg.join.clicks_topic,
        "window_seconds": CLICK_WINDOW_S,
        "emit": "at_once",
    }
    fs = cfg.feature_schema.model_dump(mode="json")
    cfg = derived(
        cfg,
        "the click written at once, the cluster following the passes",
        join={"mode": "label_in_impression"},
        schema={**fs, "labels": [click]},
        cluster={"follow_passes": True},
    )
    with LiveStack(cfg, rate=300, pass_seconds=PASS_SECONDS) as stack:
        yield stack


def _runs(stack: LiveStack) -> dict[str, dict[str, Any]]:
    """The DAG's runs by pass id, each with its task instances by task id."""
    dag = "dags/streamrec_pass/dagRuns"
    clock = stack.cfg.passes.clock
    runs = {}
    for run in stack.airflow.api(f"{dag}?limit=1000")["dag_runs"]:
        pass_id = clock.id_of(datetime.fromisoformat(run["data_interval_start"]))
        runs[run["dag_run_id"]] = {**run, "pass_id": pass_id, "tasks": {}}
    instances = stack.airflow.api(f"{dag}/~/taskInstances?limit=10000")["task_instances"]
    for ti in instances:
        if ti["dag_run_id"] in runs:
            runs[ti["dag_run_id"]]["tasks"][ti["task_id"]] = ti
    return {run["pass_id"]: run for run in runs.values()}


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_fifteen_second_passes_are_trained_once_in_order_while_the_scheduler_watches(
    live: LiveStack,
) -> None:
    """Five minutes of 15-second passes, the scheduler stopped for two windows a minute
    in: the cluster trains every complete pass once, in order, and finishes each (delivered,
    rejected or superseded) without waiting for Airflow; every pass's DAG run watches it to
    the end, the runs the outage held back once the scheduler is back; `streamrec status`
    counts a pass writer's leftover and trains nothing from it."""
    clock, data = live.cfg.passes.clock, live.cfg.paths.data_root
    first = _wait(lambda: _trained_in_order(live), 180, "a first pass trained")[0]
    _wait(lambda: len(_trained_in_order(live)) >= 4, 120, "four passes trained")
    live.airflow.stop("scheduler")
    stopped_at = time.time()
    leftover = killed_writer(pass_dir(data, clock.next(_trained_in_order(live)[-1])), "_SUCCESS")
    try:
        _wait(
            lambda: len([p for p, s in _starts(live).items() if s > stopped_at]) >= OUTAGE_WINDOWS,
            OUTAGE_WINDOWS * PASS_SECONDS + 60,
            f"{OUTAGE_WINDOWS} passes trained while the scheduler is down",
        )
    finally:
        live.airflow.start("scheduler")
    restarted_at = time.time()
    end = clock.window(first)[0] / 1000 + RUN_SECONDS
    time.sleep(max(0.0, end - time.time()))
    last = clock.id_at(int(end * 1000) - clock.width_ms)  # the last window wholly in the run
    registry = registry_for(live.cfg)
    client = ClusterClient.from_config(live.cfg)

    def finished() -> list[str] | None:
        ids = [p for p in complete_passes(data) if first <= p <= last]
        serving = registry.serving_version()
        done = all(pass_finished(client.pass_status(p), serving) for p in ids)
        return ids if ids and ids[-1] == last and done else None

    passes = _wait(finished, 120, f"every pass through {last} finished")
    trained = _trained_in_order(live)
    assert [p for p in trained if p <= last] == passes  # once each, in order, none left out
    commands = train_runs(live.cfg)
    assert all(len(commands[p]) == 1 for p in passes), {p: len(commands[p]) for p in passes}
    during = [p for p in passes if stopped_at < commands[p][0]["started_at"] < restarted_at]
    assert len(during) >= OUTAGE_WINDOWS  # the cluster did not wait for the scheduler
    assert _leftovers(live).get(str(leftover)) is True
    # every pass's run watched it to the end; the outage's runs after the restart
    runs = _wait(
        lambda: (
            (r := _runs(live)) and all(r.get(p, {}).get("state") == "success" for p in passes) and r
        ),
        120,
        "the DAG runs of every pass succeeded",
    )
    for p in passes:
        watch = runs[p]["tasks"]["watch_pass"]
        assert watch["state"] == "success", (p, watch["state"])
        delivered = client.pass_status(p).delivered is not None
        assert runs[p]["tasks"]["delivered"]["state"] == ("success" if delivered else "skipped")
    assert all(_epoch(runs[p]["tasks"]["watch_pass"]["end_date"]) > restarted_at for p in during)
    # what watching costs: from the pass finished (its training's end, or its delivery) to
    # its run's end, for the runs the outage did not hold back
    lags = sorted(
        _epoch(runs[p]["end_date"]) - clock.window(p)[1] / 1000
        for p in passes
        if p not in during and _epoch(runs[p]["start_date"]) > restarted_at + 2 * PASS_SECONDS
    )
    freshness = sorted(
        s.delivered.at - clock.window(p)[1] / 1000
        for p in passes
        if (s := client.pass_status(p)).delivered is not None
    )
    print(
        f"{len(passes)} passes of {PASS_SECONDS} s; window end to served p50 "
        f"{freshness[len(freshness) // 2]:.1f} s; window end to its DAG run's end p50 "
        f"{lags[len(lags) // 2]:.1f} s, max {lags[-1]:.1f} s ({len(lags)} runs)"
    )
    assert lags[-1] < 4 * PASS_SECONDS  # the scheduler keeps up with 15 s windows


def _gate_aucs(service: Service) -> dict[tuple[str, str], float]:
    """``streamrec_serving_gate_auc`` of the service's /metrics: (version, labels) -> AUC of
    the click."""
    text = service.client.get("/metrics").text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == GATE_METRIC]
    return {
        (s.labels["version"], s.labels["labels"]): s.value
        for s in family.samples
        if s.labels["task"] == "click"
    }


def test_the_gate_judges_the_newest_matured_pass_and_serve_shows_both(
    live: LiveStack, tmp_path: Path
) -> None:
    """The scheduler's gate decisions on a click written at once: each pass's fresh AUC
    (on the labels it was trained with) is its own progressive AUC, and the AUC judged
    against ``min_auc`` and the serving model is that of the pass its training judged on
    final labels (the pass before); `streamrec serve`'s /metrics shows both for the
    serving version, named by ``labels``."""
    client = ClusterClient.from_config(live.cfg)
    registry = registry_for(live.cfg)

    def served_on_matured() -> str | None:
        version = registry.serving_version()
        gate = registry.manifest(version).metrics.gate if version else None
        return version if gate is not None and gate.matured_pass is not None else None

    _wait(served_on_matured, 240, "a version delivered on a matured judgement")
    judged = 0
    for pass_id in _trained_in_order(live):
        status = client.pass_status(pass_id)
        gate, train = status.gate, status.train
        if gate is None or train is None:
            continue  # trained, its gate decision not stored yet
        assert gate.fresh_auc == train.test.auc
        assert gate.matured_pass == max((m.pass_id for m in train.matured), default=None)
        if gate.matured_pass is None:
            assert math.isnan(gate.auc)
            continue
        judged += 1
        matured = client.pass_status(gate.matured_pass).matured
        assert matured is not None and matured.judged_in == pass_id > gate.matured_pass
        assert gate.auc == matured.tasks["click"].auc
        low = any(r.startswith("matured AUC") and "min_auc" in r for r in gate.reasons)
        assert low == (gate.auc < live.cfg.gate.min_auc), gate.reasons
    assert judged >= 1
    service = Service(live.config_path, "inprocess", tmp_path / "serve.log")
    try:
        shown = _wait(
            lambda: (a := _gate_aucs(service)) and any(k == "matured" for _, k in a) and a,
            60,
            "the service on a version judged on matured labels",
        )
    finally:
        service.stop()
    (version,) = {v for v, _ in shown}
    gate = registry.manifest(version).metrics.gate
    assert shown == {(version, "matured"): gate.auc, (version, "fresh"): gate.fresh_auc}


def _drawn(page: str, series: str) -> list[str]:
    """The pass of each point of ``series`` on the page, from its hover title."""
    label = html.escape(series)
    return re.findall(rf'data-series="{re.escape(label)}"><title>(\d+) {re.escape(label)}:', page)


def test_report_has_a_point_per_pass(live: LiveStack, tmp_path: Path) -> None:
    """`streamrec report` on the live pipeline: a point per pass that has the figure in each
    plot, and the page drawn in headless Chromium with every plot's axes and no error."""
    out = tmp_path / "report.html"
    _, before, _ = _status(live, limit=1000)
    done = subprocess.run(
        [CLI, "report", "--config", str(live.config_path), "--out", str(out), "--limit", "1000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    _, rows, serving = _status(live, limit=1000)
    page = out.read_text()
    assert serving["version"] and serving["age_seconds"] > 0
    # the stream goes on while the report is written: each series has a point for every
    # pass that had its figure before the report and for none that lacked it after
    figures: dict[str, Callable[[PassRow], bool]] = {
        "fresh AUC": lambda r: r.trained,
        "matured AUC": lambda r: r.matured_auc is not None,
        "keys": lambda r: r.trained,
        "rows": lambda r: r.rows is not None,
        "freshness": lambda r: r.freshness_seconds is not None,
    }
    points_of = {series: _drawn(page, series) for series in figures}
    for series, has in figures.items():
        points = points_of[series]
        assert len(points) == len(set(points)), series
        had = {r.pass_id for r in before if has(r)}
        has_now = {r.pass_id for r in rows if has(r)}
        assert had <= set(points) <= has_now, (series, had, points, has_now)
    assert page.count('data-series="best reachable"') >= len(points_of["fresh AUC"]) - 1
    assert points_of["matured AUC"]  # judged a pass later: all but the newest
    delivered = [r for r in rows if r.pass_id in points_of["freshness"]]
    assert delivered and all(0 < r.freshness_seconds < 300 for r in delivered)
    # the written file as an operator opens it: every plot drawn with its axes, no error
    shown = open_page(out, screenshot=tmp_path / "report.png")
    assert shown.errors == []
    target = stale_after_seconds(live.cfg.passes.clock)
    titles = [p.title for p in plots(target, matured=True)]
    drawn = [c.label for c in shown.charts]
    assert drawn == [t for t in titles if t in drawn]  # in page order
    assert len(drawn) + page.count('class="empty"') == len(titles)
    assert {"Progressive AUC (before training on the pass)", "Rows per pass"} <= set(drawn)
    assert {"Freshness (serving time - window end)", "Sparse table size"} <= set(drawn)
    ids = {r.pass_id for r in rows}
    for chart in shown.charts:
        assert chart.x_ticks and set(chart.x_ticks) <= ids and chart.y_ticks, chart.label
        assert chart.x_label == [X_LABEL] and len(chart.y_label) == 1, chart.label
        assert 0 < chart.points == chart.titled, chart.label
    freshness = shown.charts[drawn.index("Freshness (serving time - window end)")]
    assert freshness.points == len(points_of["freshness"]) and freshness.y_ticks[0] == "0"
    assert f"target: two windows ({target:.0f} s)" in freshness.texts
