"""Multi-task networks on the real cluster: the ``examples/conversions`` ESMM and MMoE
networks (named by import path, outside streamrec's packages) trained by ``streamrec
cluster`` on the two-label stream, each task with its own progressive metrics and its own
intercept refit, each close to the best AUC its label allows; then gated per head, exported
with every head, published and delivered by the CLI, and served by ``streamrec serve`` (on
Paddle Inference and on onnxruntime) and ``streamrec predict`` with each head's score equal
to the cluster's own inference to 1e-5.

The stream's labels are drawn from known probabilities, so each task has a best reachable
AUC on each pass: the click's is that of p(click) on the clicks, the conversion's (on every
impression, the conversion label being "clicked and converted in time") that of
p(click) p(conversion | click). The claim is the issue's: from the fourth pass on, each
task's progressive AUC is within 0.03 of its best. The test takes the mean gap over passes
4-9, paired (the model and the best AUC score the same rows, so the rows' luck largely
cancels): in a run before this test the gaps were 0.011-0.028 a pass for ESMM's
conversions (mean 0.021), 0.011-0.020 for its clicks, and the gap's standard deviation
over passes was 0.006, a standard error of 0.0025 for the mean of six, so the 0.03 bar
stands about four standard errors above the mean measured. The bar can fail: scoring the
conversions with the click head's probability misses it by far (checked below on the same
passes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_cluster import cli_cluster, cli_json
from pass_rows import cluster_task_scores, pass_events
from serve_process import Service

from serving_export.delivery import evaluate
from streaming.producer import synthetic_passes
from streamrec.config import PipelineConfig, derived, dump_config, load_config, with_services
from streamrec.config.cluster import PathConfig
from streamrec.contracts.training import TrainResult
from trainers.metrics import exact_auc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversions"
CLI = str(Path(sys.executable).with_name("streamrec"))
FIRST = "202608010000"
PASSES = 9
FROM = 3  # the fourth pass
BAR = 0.03


def _config(services, root: Path, model: str) -> PipelineConfig:
    suffix = uuid.uuid4().hex[:8]
    cfg = with_services(
        load_config(EXAMPLE / "pipeline.yaml"), services.bootstrap_servers, services.redis_url
    )
    data = cfg.model_dump(mode="json", by_alias=True)
    data["model"] = yaml.safe_load((EXAMPLE / model).read_text())
    fs = data["schema"]
    click, conversion = fs["labels"]
    return derived(
        PipelineConfig.model_validate(data),
        "the conversions example on the test's services",
        name=f"tasks{suffix}",
        schema={
            **fs,
            "labels": [
                {**click, "topic": f"clicks-{suffix}", "window_seconds": 60},
                {**conversion, "topic": f"conversions-{suffix}", "window_seconds": 1200},
            ],
        },
        cluster={"follow_passes": False},  # the test sends the cluster its commands
        kafka={"impressions_topic": f"impressions-{suffix}"},
        passes={"allowed_lateness_seconds": 10, "idle_partition_seconds": 3},
        paths=PathConfig.under(root),
        synthetic={
            "click_delay_seconds": 20,
            "conversion": {"delay_median_seconds": 120, "delay_sigma": 1.5},
        },
    )


@pytest.fixture(scope="module")
def stream(services, tmp_path_factory: pytest.TempPathFactory):
    """The two-label passes, produced by ``streamrec produce`` (conversions on their own
    topic after their clicks, some past their window) and cut by ``streamrec build-passes``;
    the config that built them and their batches, redrawn from the same seed."""
    root = tmp_path_factory.mktemp("tasks")
    cfg = _config(services, root, "model_esmm.yaml")
    config = dump_config(cfg, root / "stream.yaml")
    last = list(dict(synthetic_passes(cfg, FIRST, PASSES)))[PASSES - 1]
    for args in (
        ["produce", "--synthetic", "--passes", str(PASSES), "--start", FIRST],
        ["build-passes", "--until-pass", last],
    ):
        done = subprocess.run(
            [CLI, args[0], "--config", str(config), *args[1:]],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    batches = dict(synthetic_passes(cfg, FIRST, PASSES))
    return cfg, {p: batches[p] for p in list(batches)[:PASSES]}


def _best(cfg: PipelineConfig, batch) -> dict[str, float]:
    labels = batch.expected_labels(cfg.labels)
    joint = batch.probabilities * batch.conversion_probabilities
    return {
        "click": exact_auc(batch.probabilities, labels["click"]),
        "conversion": exact_auc(joint, labels["conversion"]),
    }


@pytest.mark.parametrize("model", ["model_esmm.yaml", "model_mmoe.yaml"])
def test_each_task_learns_close_to_its_best_auc_and_serves_like_the_cluster(
    stream, model: str, tmp_path: Path
) -> None:
    built, batches = stream
    cfg = _config_on(built, model, tmp_path)
    Path(cfg.paths.work_root).mkdir(parents=True, exist_ok=True)
    config = dump_config(cfg, tmp_path / "pipeline.yaml")
    passes = list(batches)
    events = pass_events(cfg, passes[-1])
    with cli_cluster(config, env={"PYTHONPATH": str(EXAMPLE)}) as client:
        results = [client.train(p) for p in passes[:-1]]
        raw = client.export(passes[-2]).raw_export
        expected = cluster_task_scores(client, passes[-1], events)  # before training on it
        results.append(client.train(passes[-1]))
    _served_like_the_cluster(cfg, config, raw, results[-2], events, expected)
    # streamrec status shows each task's figures beside the main task's, with its best AUC
    status = subprocess.run(
        [CLI, "status", "--config", str(config), "--json"], capture_output=True, timeout=120
    )
    rows = {r["pass_id"]: r for r in json.loads(status.stdout)["passes"]}
    for pass_id, result in zip(passes, results, strict=True):
        shown = rows[pass_id]["tasks"]["conversion"]
        assert shown["auc"] == pytest.approx(result.tasks["conversion"].test.auc)
        assert shown["best_auc"] == pytest.approx(_best(cfg, batches[pass_id])["conversion"])
    gaps: dict[str, list[float]] = {"click": [], "conversion": []}
    for result, batch in zip(results, batches.values(), strict=True):
        assert result.count_matches_manifest
        assert set(result.tasks) == {"conversion", "conversion|click"}
        task = result.tasks["conversion"]
        assert task.test.count == result.test.count  # the same rows scored for both heads
        assert task.intercept is not None and result.intercept is not None
        best = _best(cfg, batch)
        gaps["click"].append(best["click"] - result.test.auc)
        gaps["conversion"].append(best["conversion"] - task.test.auc)
    late = {name: float(np.mean(g[FROM:])) for name, g in gaps.items()}
    print(model, {name: np.round(g, 4).tolist() for name, g in gaps.items()}, late)
    assert all(gap < BAR for gap in late.values()), late
    # p(conversion | click) on the clicked rows (every row is scored: a pass is smaller than
    # progressive_rows): measured on exactly those, with no bias of its own
    conditional = [r.tasks["conversion|click"] for r in results]
    clicked = [b.expected_labels(cfg.labels)["click"] == 1 for b in batches.values()]
    assert [c.test.count for c in conditional] == [int(c.sum()) for c in clicked]
    assert all(c.intercept is None for c in conditional)
    best_cvr = [
        exact_auc(b.conversion_probabilities[c], b.expected_labels(cfg.labels)["conversion"][c])
        for b, c in zip(batches.values(), clicked, strict=True)
    ]
    cvr_gaps = [x - c.test.auc for x, c in zip(best_cvr, conditional, strict=True)][FROM:]
    print(model, "p(conversion | click) gaps", np.round(cvr_gaps, 4).tolist())
    # refitted per task: each head's predictions add up to its own label's positives
    conversion = [r.tasks["conversion"].test.copc for r in results[FROM:]]
    assert all(0.85 < copc < 1.15 for copc in conversion), conversion
    # the bar is not one any score passes: the click probability ranks conversions far worse
    click_for_conversion = [
        _best(cfg, b)["conversion"]
        - exact_auc(b.probabilities, b.expected_labels(cfg.labels)["conversion"])
        for b in list(batches.values())[FROM:]
    ]
    assert np.mean(click_for_conversion) > BAR, click_for_conversion


def _config_on(built: PipelineConfig, model: str, root: Path) -> PipelineConfig:
    """``built``'s passes and services, trained by ``model`` in folders of its own."""
    data = built.model_dump(mode="json", by_alias=True)
    data["model"] = yaml.safe_load((EXAMPLE / model).read_text())
    data["name"] = f"{built.name}-{data['model']['model']}"
    data["paths"] = {
        **PathConfig.under(root).model_dump(mode="json"),
        "data_root": str(built.paths.data_root),
    }
    return PipelineConfig.model_validate(data)


def _served_like_the_cluster(
    cfg: PipelineConfig,
    config: Path,
    raw: str,
    result: TrainResult,
    events: list[dict],
    expected: dict[str, np.ndarray],
) -> None:
    """The export of a pass, gated, published and delivered by the CLI, served by
    ``streamrec serve`` on both runtimes and by ``streamrec predict``: every head's score
    equals the cluster's own inference to 1e-5."""
    decision = evaluate(cfg, result)  # the gate's decision, as the DAG stores it
    assert decision.passed and set(decision.task_aucs) == {"conversion"}, decision
    version = cli_json("publish", "--config", str(config), "--raw-export", raw)["version"]
    assert cli_json("deliver", "--config", str(config), "--version", version)["serving"] == version
    manifest = json.loads(
        (Path(cfg.paths.model_root) / cfg.model.model / version / "MANIFEST.json").read_text()
    )
    assert manifest["outputs"] == ["click", "conversion"]
    for runtime in ("paddle", "onnx"):
        served = Service(config, "inprocess", Path(cfg.paths.work_root) / "serve.log", runtime)
        try:
            served.wait_for(version)
            answers = [
                served.client.post("/predict", json={"events": events[i : i + 500]}).json()
                for i in range(0, len(events), 500)
            ]
            runs = served.client.get("/version").json()["runtime"]
        finally:
            served.stop()
        click = np.concatenate([a["p_click"] for a in answers])
        heads = {t: np.concatenate([a["p"][t] for a in answers]) for t in ("click", "conversion")}
        print(runtime, "ran on", runs)
        np.testing.assert_array_equal(click, heads["click"])
        np.testing.assert_allclose(heads["click"], expected["p_click"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(heads["conversion"], expected["p_conversion"], rtol=0, atol=1e-5)
    lines = Path(cfg.paths.work_root) / "events.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in events[:200]))
    done = subprocess.run(
        [CLI, "predict", "--config", str(config), "--events", str(lines)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    conversion = np.array([p["p"]["conversion"] for p in printed])
    np.testing.assert_allclose(conversion, expected["p_conversion"][:200], rtol=0, atol=1e-5)
