"""The real Airflow scheduler trains a live stream, pass by pass (no ``dag.test()``).

``LiveStack`` is the live mode (``streamrec demo --live``): a live synthetic stream of
1-minute passes, the pass builder, a fleetrun cluster (1 server + 2 workers) and Airflow's
own ``api-server``, ``scheduler`` and ``dag-processor`` processes (LocalExecutor). The DAG is
unpaused before the stream begins, from a schedule start before it, as a new user's would be.
The tests read what the scheduler's runs left behind; the operator CLI is run as a user runs
it, as a subprocess.
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

from demo.live import LiveStack
from ops.catchup import caught_up_by
from ops.report import X_LABEL, plots
from ops.status import PassRow, stale_after_seconds
from serving_export.delivery import registry_for
from streamrec.config import derived
from streamrec.passes import complete_passes, next_pass_id, pass_dir, pass_id_at
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import list_checkpoints
from trainers.control_plane import ClusterClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLI = str(Path(sys.executable).with_name("streamrec"))
FIRST_RUN_PASSES = 3  # three in order show the order; each more is a minute of the suite
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


def _train_commands(stack: LiveStack) -> dict[str, list[dict[str, Any]]]:
    """Every train command the cluster completed, by pass: results that trained (not the
    'already done' acknowledgements of a repeated command)."""
    r, keys = connect(stack.cfg.redis), RedisKeys(stack.cfg.name)
    trained: dict[str, list[dict[str, Any]]] = {}
    for key in scan_keys(r, keys.command("*")):
        command = r.hgetall(key)
        if command.get("kind") == "train" and command.get("status") == "done":
            result = json.loads(command["result"])
            if not result.get("already_done"):
                trained.setdefault(command["pass_id"], []).append(result)
    return trained


def _trained_in_order(stack: LiveStack) -> list[str]:
    """Passes whose train command is done, in the order the cluster trained them (the
    checkpoint sequence; a checkpoint is published just before its command is done)."""
    done = _train_commands(stack)
    return [
        c.pass_id for c in list_checkpoints(stack.cfg.paths.checkpoint_root) if c.pass_id in done
    ]


def _sensor_skipped(stack: LiveStack) -> set[str]:
    """Pass ids of the DAG runs whose sensor skipped the run."""
    dag = "dags/streamrec_pass/dagRuns"
    runs = {r["dag_run_id"]: r for r in stack.airflow.api(f"{dag}?limit=1000")["dag_runs"]}
    skipped = stack.airflow.api(f"{dag}/~/taskInstances?task_id=wait_pass&state=skipped&limit=1000")
    return {
        pass_id_at(datetime.fromisoformat(runs[ti["dag_run_id"]]["data_interval_start"]))
        for ti in skipped["task_instances"]
    }


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
        "the click written at once",
        join={"mode": "label_in_impression"},
        schema={**fs, "labels": [click]},
    )
    with LiveStack(cfg, rate=300) as stack:
        yield stack


def test_every_pass_is_trained_once_in_order_and_the_last_delivered(live: LiveStack) -> None:
    """From a schedule start before the stream: the windows before it are skipped, then
    every complete pass is trained exactly once, in order, and the last one serves."""
    started = pass_id_at(live.cfg.schedule.start)
    trained = _wait(
        lambda: (t := _trained_in_order(live))[FIRST_RUN_PASSES - 1 :] and t,
        600,
        f"{FIRST_RUN_PASSES} passes trained by the scheduler",
    )
    first = trained[:FIRST_RUN_PASSES]
    assert trained == sorted(trained), "passes were trained out of order"
    complete = complete_passes(live.cfg.paths.data_root)
    assert complete[0] >= started  # the stream began after the schedule's start
    # no complete pass between the first and the last trained one was left out
    assert [p for p in complete if p <= first[-1]] == first
    commands = _train_commands(live)
    assert all(len(commands[p]) == 1 for p in first), {p: len(commands[p]) for p in first}
    starts = [commands[p][0]["started_at"] for p in first]
    assert starts == sorted(starts)
    last = first[-1]
    registry = registry_for(live.cfg)
    _wait(lambda: (registry.serving_version() or "") >= last, 180, f"pass {last} delivered")
    assert last in registry.versions()  # delivered (a newer pass may serve by now)


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


def test_stopped_scheduler_leaves_passes_flagged_then_catches_up_in_order(
    live: LiveStack,
) -> None:
    """The scheduler is stopped for two windows: `streamrec status` flags the passes that
    completed meanwhile as not trained; after a restart they are trained, once, in order,
    the backlog by the run that finds it (``ops/catchup.py``), whose later runs skip."""
    before = _wait(lambda: _trained_in_order(live), 60, "a trained pass")
    live.airflow.stop("scheduler")
    stopped_at = time.time()
    # a pass writer killed after the donefile, before the rename: the DAG and status skip it
    data = live.cfg.paths.data_root
    nxt = next_pass_id(before[-1], live.cfg.passes.pass_minutes)
    leftover = killed_writer(pass_dir(data, nxt), "_manifest.json", "_SUCCESS")
    try:
        missed = _wait(
            lambda: (
                (m := [p for p in complete_passes(live.cfg.paths.data_root) if p > before[-1]])[
                    OUTAGE_WINDOWS - 1 :
                ]
                and m
            ),
            OUTAGE_WINDOWS * 60 + 120,
            f"{OUTAGE_WINDOWS} passes completing while the scheduler is down",
        )
        code, rows, _ = _status(live)
        by_pass = {row.pass_id: row for row in rows}
        untrained = [p for p in missed if not by_pass[p].trained]
        assert len(untrained) >= OUTAGE_WINDOWS - 1, [by_pass[p].flag for p in missed]
        assert all(by_pass[p].flag for p in untrained)
        assert code == (5 if any("stale" in by_pass[p].flag for p in untrained) else 0)
        assert by_pass[before[-1]].trained and by_pass[before[-1]].auc is not None
    finally:
        live.airflow.start("scheduler")
    restarted_at = time.time()
    caught_up = _wait(
        lambda: t if set(missed) <= set(t := _trained_in_order(live)) else None,
        OUTAGE_WINDOWS * 120 + 300,
        f"the missed passes {missed} trained after the restart",
    )
    assert caught_up == sorted(caught_up)
    complete = complete_passes(live.cfg.paths.data_root)
    assert [p for p in complete if before[0] <= p <= missed[-1]] == [
        p for p in caught_up if p <= missed[-1]
    ]
    commands = _train_commands(live)
    assert all(len(commands[p]) == 1 for p in caught_up)
    for p in untrained:
        assert commands[p][0]["started_at"] > restarted_at > stopped_at
    # behind by two windows or more, a run trains the complete passes after its own (each
    # judged by the gate) and the runs of those skip at their sensor
    caught = {p: by for p in missed if (by := caught_up_by(live.cfg, p)) is not None}
    assert caught, f"no run caught up any of {missed}"
    assert all(by.by_run_of < p for p, by in caught.items())
    client = ClusterClient.from_config(live.cfg)
    # the gate decision is stored just after the train command is done
    _wait(
        lambda: all(client.pass_status(p).gate is not None for p in caught),
        120,
        f"the gate decisions of {sorted(caught)}",
    )
    _wait(lambda: set(caught) <= _sensor_skipped(live), 300, f"the runs of {set(caught)} skipped")
    # `streamrec status` names the run that caught each up, and the leftover it skipped
    rows = {row.pass_id: row for row in _status(live, limit=1000)[1]}
    assert _leftovers(live).get(str(leftover)) is True  # live writers' may be there too
    assert {p: rows[p].caught_up_by for p in caught} == {
        p: by.by_run_of for p, by in caught.items()
    }
    # a catch-up delivers only the newest pass it trained; the others, and the run's own
    # pass unless it was delivered before the backlog came, are marked superseded by that
    # one (what ops.status.pass_finished reads)
    for run in {by.by_run_of for by in caught.values()}:
        mine = sorted(p for p, row in rows.items() if row.caught_up_by == run)
        newest = mine[-1]
        for p in [run, *mine[:-1]]:
            status = client.pass_status(p)
            assert (p == run and status.delivered is not None) or (
                status.superseded is not None and status.superseded.by == newest
            )
        assert client.pass_status(newest).superseded is None


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
    target = stale_after_seconds(live.cfg.passes.pass_minutes)
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
