"""Labels written before their window closes, through ``streamrec produce``, a
``streamrec build-passes`` SIGKILLed several times, and ``streamrec cluster``.

The ``examples/conversions`` stream (ESMM: a click head and a conversion head) with its
click ``at_once`` (a negative at once, a duplicate positive when the click comes, within
60 s) and its conversion ``after_wait`` 5 minutes (the label as of then, a duplicate for a
later one, within 20 minutes; a conversion requires its click). The generator is seeded,
so the test redraws every impression's click and conversion times and knows each row the
builder must write, in which pass, by event id. The cluster trains the passes; each pass
is judged again on its final labels two passes later (20 minutes): those matured metrics
must equal numpy's on the cluster's own progressive scores and the generator's labels.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from cli_cluster import cli_cluster
from prometheus_client.parser import text_string_to_metric_families

from streaming.producer import synthetic_passes
from streamrec.config import PipelineConfig, derived, dump_config, load_config, with_services
from streamrec.config.cluster import PathConfig
from streamrec.entry import STOPPED
from streamrec.layout import Layout
from streamrec.passes import PassClock, RowKind, pass_dir, read_manifest
from streamrec.ports import free_port
from trainers.metrics import exact_auc
from trainers.models import AUC_BUCKETS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversions"
CLI = str(Path(sys.executable).with_name("streamrec"))
FIRST = "202609010000"
PASSES = 5  # produced; the matured rows of the last come two passes later
CLICK_S, WAIT_S, CONVERSION_S = 60, 300, 1200


def _config(services, root: Path) -> PipelineConfig:
    suffix = uuid.uuid4().hex[:8]
    cfg = with_services(
        load_config(EXAMPLE / "pipeline.yaml"), services.bootstrap_servers, services.redis_url
    )
    data = cfg.model_dump(mode="json", by_alias=True)
    data["model"] = yaml.safe_load((EXAMPLE / "model_esmm.yaml").read_text())
    fs = data["schema"]
    click, conversion = fs["labels"]
    labels = [
        {**click, "topic": f"clicks-{suffix}", "window_seconds": CLICK_S, "emit": "at_once"},
        {
            **conversion,
            "topic": f"conversions-{suffix}",
            "window_seconds": CONVERSION_S,
            "emit": "after_wait",
            "wait_seconds": WAIT_S,
        },
    ]
    return derived(
        PipelineConfig.model_validate(data),
        "the conversions example, labels written early, on the test's services",
        name=f"fresh{suffix}",
        schema={**fs, "labels": labels},
        cluster={"follow_passes": False},  # the test sends the cluster its commands
        kafka={"impressions_topic": f"impressions-{suffix}", "session_timeout_ms": 6000},
        passes={
            "allowed_lateness_seconds": 10,
            "idle_partition_seconds": 3,
            "parts_per_pass": 2,
            "join_memory_mib": 1,  # spilled at every poll: restarts resume from the store
        },
        paths=PathConfig.under(root),
        synthetic={
            "events_per_pass": 3000,
            "click_delay_seconds": 20,
            "conversion": {"delay_median_seconds": 240, "delay_sigma": 1.0},
        },
    )


def _after(pass_id: str, n: int) -> str:
    for _ in range(n):
        pass_id = PassClock(600).next(pass_id)
    return pass_id


def _window(ms: int) -> str:
    return PassClock(600).id_at(int(ms))


def _implied(cfg: PipelineConfig) -> tuple[Counter[tuple], dict[str, tuple[int, int]]]:
    """Every row the generator's events imply, as (event_id, kind_click, kind_conversion,
    label, label_conversion, pass or "matured@<pass>"); and each impression's final
    labels (click, conversion)."""
    rows: Counter[tuple] = Counter()
    final = {}
    for batch in [b for _, b in synthetic_passes(cfg, FIRST, PASSES)][:PASSES]:
        for event, click, conv in zip(
            batch.events, batch.click_times, batch.conversion_times, strict=True
        ):
            e, t = event["event_id"], event["event_time"]
            clicked = 0 <= click - t <= CLICK_S * 1000
            converted = clicked and conv >= 0 and conv - t <= CONVERSION_S * 1000
            waited = converted and conv - t <= WAIT_S * 1000
            rows[(e, 1, 0, 0, 0, _window(t))] += 1
            rows[(e, 0, 1, 0, int(waited), _window(t + WAIT_S * 1000))] += 1
            if clicked:
                rows[(e, 2, 0, 1, 0, _window(click))] += 1
            if converted and not waited:
                rows[(e, 0, 2, 0, 1, _window(conv))] += 1
            rows[(e, 3, 3, int(clicked), int(converted), f"matured@{_window(t + 1_200_000)}")] += 1
            final[e] = (int(clicked), int(converted))
    return rows, final


def _written(cfg: PipelineConfig, through: str, ids: set[str]) -> Counter[tuple]:
    """The rows of every pass from FIRST through ``through`` of the impressions ``ids``."""
    written: Counter[tuple] = Counter()
    columns = ["event_id", "kind_click", "kind_conversion", "label", "label_conversion"]
    pass_id = FIRST
    while pass_id <= through:
        directory = pass_dir(cfg.paths.data_root, pass_id)
        manifest = read_manifest(directory)
        for parts, where in (
            (manifest.parts, pass_id),
            (manifest.matured_parts, f"matured@{pass_id}"),
        ):
            for part in parts:
                for row in pq.read_table(directory / part.file, columns=columns).to_pylist():
                    if row["event_id"] in ids:
                        written[(*row.values(), where)] += 1
        pass_id = PassClock(600).next(pass_id)
    return written


def _slices(cfg: PipelineConfig) -> int:
    """How many slices the builders have published."""
    return len(list((Path(cfg.paths.data_root) / "slices").glob("*/*/p*/_SUCCESS")))


def _run_in_steps(
    proc: subprocess.Popen, cfg: PipelineConfig, slices: int, then_s: float = 0.0
) -> None:
    """Let ``proc`` run a few ms at a time (SIGCONT, a nap, SIGSTOP) until ``slices``
    slices are published, then ``then_s`` more, or until it exits; it is left stopped. A
    builder polled while it runs freely writes the rest of these small passes between two
    polls of a loaded machine, and the test's kills missed."""
    while proc.poll() is None and _slices(cfg) < slices:
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.003)
        proc.send_signal(signal.SIGSTOP)
    end = time.monotonic() + then_s
    while proc.poll() is None and time.monotonic() < end:
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.002)
        proc.send_signal(signal.SIGSTOP)


def _build_with_kills(config: Path, cfg: PipelineConfig, until: str) -> tuple[int, str]:
    """Run ``build-passes`` until ``until`` is complete, SIGKILLed four times a slice or two
    after it started, alternately the moment the slice is published (before the join's
    checkpoint: a restart then replays the topics) and 10-50 ms later; then once more,
    stopped cleanly at ``until`` before: that run resumes from the spill store and must
    write nothing. The builder runs in steps of a few ms (``_run_in_steps``), so each kill
    lands where it was aimed: a clean first run, as this test had, wrote most slices at
    once (the whole topic comes in one fetch) and left too few to aim at. The kills and
    the builders' logs."""
    rng = random.Random(58)
    kills, deadline = 0, time.monotonic() + 200
    log = Path(cfg.paths.work_root) / "build-passes.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    build = [CLI, "build-passes", "--config", str(config), "--until-pass", until]
    while not (pass_dir(cfg.paths.data_root, until) / "_SUCCESS").exists():
        assert time.monotonic() < deadline, "the builder did not finish"
        with log.open("ab") as out:
            proc = subprocess.Popen(build, stdout=subprocess.DEVNULL, stderr=out)
        if kills < 4:
            later = rng.uniform(0.01, 0.05) if kills % 2 else 0.0
            _run_in_steps(proc, cfg, _slices(cfg) + rng.randint(1, 2), later)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        proc.wait(timeout=300)
    written = _slices(cfg)
    with log.open("ab") as out:
        again = subprocess.run(build, stderr=out, timeout=120)
    assert again.returncode == 0 and _slices(cfg) == written, log.read_text()[-3000:]
    return kills, log.read_text()


def _scored(cfg: PipelineConfig, pass_id: str) -> dict[str, np.ndarray]:
    """The cluster's progressive scores of ``pass_id``: event id, p_click, p_conversion,
    each task's row kind (files as the cluster numbered them: parts, then matured parts)."""
    directory = pass_dir(cfg.paths.data_root, pass_id)
    manifest = read_manifest(directory)
    files = [directory / p.file for p in [*manifest.parts, *manifest.matured_parts]]
    ids = [pq.read_table(f, columns=["event_id"])["event_id"].to_pylist() for f in files]
    folder = Layout.of(cfg.paths).scores_dir(pass_id, "progressive")
    table = pq.read_table(sorted(folder.glob("worker-*.parquet"))).to_pydict()
    rows = np.array(table.pop("row"))
    table["event_id"] = [ids[r >> 32][r & 0xFFFFFFFF] for r in rows.tolist()]
    return {k: np.array(v) for k, v in table.items()}


@pytest.fixture(scope="module")
def built(services, tmp_path_factory: pytest.TempPathFactory):
    """The stream produced by ``streamrec produce`` and cut by ``streamrec build-passes``,
    SIGKILLed four times and run again once it was done, its join spilled; its config, the
    kills and the builders' log."""
    root = tmp_path_factory.mktemp("fresh")
    cfg = _config(services, root)
    config = dump_config(cfg, root / "fresh.yaml")
    produce = ["produce", "--config", str(config), "--synthetic", "--passes", str(PASSES)]
    done = subprocess.run([CLI, *produce, "--start", FIRST], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    kills, log = _build_with_kills(config, cfg, _after(FIRST, PASSES + 1))
    return cfg, kills, log


def test_fresh_rows_are_written_once_by_event_id_however_often_the_builder_dies(built) -> None:
    cfg, kills, log = built
    assert kills == 4
    assert "from its spill store" in log, log[-3000:]  # a restart that replayed nothing
    implied, final = _implied(cfg)
    written = _written(cfg, _after(FIRST, PASSES + 1), set(final))
    missing, extra = implied - written, written - implied
    # compared as two differences: pytest's diff of two 75,000-row dicts hides which rows
    assert not missing and not extra, (
        f"{sum(missing.values())} missing, e.g. {sorted(missing)[:6]}; "
        f"{sum(extra.values())} extra, e.g. {sorted(extra)[:6]}"
    )
    kinds = Counter(k for row in implied for k in row[1:3])
    assert kinds[RowKind.DUPLICATE] > 100 and kinds[RowKind.OBSERVED] > 1000  # both policies
    manifests = [
        read_manifest(pass_dir(cfg.paths.data_root, _after(FIRST, i))) for i in range(PASSES)
    ]
    click = [m.counts.labels["click"] for m in manifests]
    assert sum(c.observed for c in click) == len(final)
    end = _after(FIRST, PASSES)
    assert sum(c.duplicates for c in click) == sum(
        n for row, n in implied.items() if row[1] == RowKind.DUPLICATE and row[5] < end
    )
    assert all(c.open > 0 for c in click)  # impressions whose click could still come


def _trained_by(cfg: PipelineConfig, weights: str, root: Path) -> Path:
    """``cfg``'s passes, trained with every label's ``loss_weights`` set to ``weights``, in
    folders (and Redis keys) of its own."""
    data = cfg.model_dump(mode="json", by_alias=True)
    data["schema"]["labels"] = [{**x, "loss_weights": weights} for x in data["schema"]["labels"]]
    data["name"] = f"{cfg.name}-{weights.replace('_', '')}"
    data["paths"] = {
        **PathConfig.under(root).model_dump(mode="json"),
        "data_root": str(cfg.paths.data_root),
    }
    trained = PipelineConfig.model_validate(data)
    Path(trained.paths.work_root).mkdir(parents=True, exist_ok=True)
    return dump_config(trained, root / "pipeline.yaml")


@pytest.mark.parametrize("weights", ["by_emit", "none"])
def test_passes_are_judged_again_on_their_final_labels_and_the_weights_calibrate(
    built, weights: str, tmp_path: Path
) -> None:
    """Each pass's matured metrics equal numpy's on the cluster's progressive scores and
    the generator's final labels. The click (at_once) is calibrated on its true labels
    with the weights: the pooled matured COPC of passes 2-5 is within a bar of 1 of four
    standard errors of the pooled ratio under Bernoulli sampling, its variance tripled:
    doubled for the intercept refit's own pass of the same size, and half again for what
    was measured beyond the binomial (pass by pass, 3,000-impression passes spread 0.065
    against the binomial's 0.054: 1.45 times the variance). Without the weights the model
    learns the rate of the rows written, p / (1 + p), and the COPC rises past the bar by
    about the click rate (0.23 here)."""
    cfg, _, _ = built
    config = _trained_by(cfg, weights, tmp_path)
    _, final = _implied(cfg)
    passes = [_after(FIRST, i) for i in range(PASSES + 2)]
    with cli_cluster(config, env={"PYTHONPATH": str(EXAMPLE)}) as client:
        results = [client.train(p) for p in passes]
        statuses = {p: client.pass_status(p) for p in passes}
    assert all(r.count_matches_manifest for r in results)
    judged = [m.pass_id for r in results for m in r.matured]
    assert judged == passes[:PASSES]  # each judged once, two passes (20 minutes) later
    clicks, predicted, variance = 0.0, 0.0, 0.0
    trained = load_config(config)
    for n, pass_id in enumerate(passes[:PASSES]):
        matured = statuses[pass_id].matured
        assert matured is not None and matured.judged_in == _after(pass_id, 2)
        scored = _scored(trained, pass_id)
        for i, task in enumerate(("click", "conversion")):
            observed = scored[f"kind_{task}"] == RowKind.OBSERVED
            p = scored[f"p_{task}"][observed].astype(np.float64)
            y = np.array([final[e][i] for e in scored["event_id"][observed]])
            got = matured.tasks[task]
            assert got.count == len(y) > 0
            # the cluster's AUC is over 4095 score buckets (ties count half): numpy's exact
            # AUC of the bucketed scores (an untrained model's scores share a few buckets)
            assert got.auc == pytest.approx(exact_auc(np.floor(p * AUC_BUCKETS), y), abs=1e-4)
            q = np.clip(p, 1e-7, 1 - 1e-7)
            logloss = float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).mean())
            assert got.logloss == pytest.approx(logloss, rel=1e-5)
            assert got.copc == pytest.approx(y.sum() / p.sum(), rel=1e-5)
            if task == "click" and n >= 1:  # the first pass met an untrained model
                clicks, predicted = clicks + y.sum(), predicted + p.sum()
                variance += float((p * (1 - p)).sum())
    # streamrec status shows both, named: the fresh figures and the matured ones
    status = subprocess.run(
        [CLI, "status", "--config", str(config), "--json"], capture_output=True, timeout=120
    )
    assert status.returncode == 0, status.stderr.decode()[-3000:]
    rows = {r["pass_id"]: r for r in json.loads(status.stdout)["passes"]}
    for pass_id in passes[:PASSES]:
        matured = statuses[pass_id].matured
        assert matured is not None
        row = rows[pass_id]
        assert row["judged_in"] == matured.judged_in
        assert row["matured_auc"] == pytest.approx(matured.tasks["click"].auc)
        assert row["matured_tasks"]["conversion"]["copc"] == pytest.approx(
            matured.tasks["conversion"].copc
        )
    table = subprocess.run([CLI, "status", "--config", str(config)], capture_output=True, text=True)
    assert "fresh AUC" in table.stdout and "matured AUC" in table.stdout
    if weights == "by_emit":
        _exporter_shows_what_status_shows(config, json.loads(status.stdout), tmp_path)
    copc = clicks / predicted
    bar = 4 * np.sqrt(3 * variance) / predicted
    print(weights, "pooled matured click COPC", round(copc, 4), "bar", round(bar, 4))
    if weights == "by_emit":
        assert abs(copc - 1) < bar
    else:
        assert copc - 1 > bar


def _exporter_shows_what_status_shows(config: Path, status: dict, tmp_path: Path) -> None:
    """``streamrec exporter``'s /metrics, scraped as Prometheus would, hold the figures
    ``streamrec status --json`` shows: the newest pass at each stage, each task's
    progressive and matured AUC and COPC, the nodes (the cluster is stopped here)."""
    port = free_port()
    log = (tmp_path / "exporter.log").open("w")
    exporter = subprocess.Popen(
        [CLI, "exporter", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert exporter.poll() is None, (tmp_path / "exporter.log").read_text()
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the exporter did not answer"
                time.sleep(0.2)
    finally:
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(timeout=30) == STOPPED
        log.close()
    got = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pipeline"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    rows = status["passes"]
    trained = max((r for r in rows if r["trained"]), key=lambda r: r["pass_id"])
    matured = max((r for r in rows if r["judged_in"]), key=lambda r: r["pass_id"])
    complete = max((r for r in rows if r["complete"]), key=lambda r: r["pass_id"])

    def value(name: str, **labels: str) -> float:
        return got[(f"streamrec_{name}", tuple(sorted(labels.items())))]

    assert value("pass_window_end_timestamp_seconds", stage="trained") == trained["window_end"]
    assert value("pass_window_end_timestamp_seconds", stage="complete") == complete["window_end"]
    assert value("pass_rows") == complete["rows"]
    assert value("pass_auc", task="click", labels="progressive") == pytest.approx(trained["auc"])
    assert value("pass_auc", task="conversion", labels="progressive") == pytest.approx(
        trained["tasks"]["conversion"]["auc"]
    )
    assert value("pass_auc", task="click", labels="matured") == pytest.approx(
        matured["matured_auc"]
    )
    assert value("pass_copc", task="conversion", labels="matured") == pytest.approx(
        matured["matured_tasks"]["conversion"]["copc"]
    )
    assert value("table_keys") == trained["table_keys"]
    assert all(
        value("cluster_node_up", node=node) == (beat is not None and beat["state"] == "running")
        for node, beat in status["cluster"]["nodes"].items()
    )
    assert ("streamrec_pass_window_end_timestamp_seconds", (("stage", "delivered"),)) not in got
