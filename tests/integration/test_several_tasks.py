"""Multi-task networks on the real cluster: the ``examples/conversions`` ESMM and MMoE
networks (named by import path, outside streamrec's packages) trained by ``streamrec
cluster`` on the two-label stream, each task with its own progressive metrics and its own
intercept refit, each close to the best AUC its label allows.

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

import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_cluster import cli_cluster

from streamrec.config import PipelineConfig, derived, dump_config, load_config, with_services
from streamrec.config.cluster import PathConfig
from trainers.metrics import exact_auc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversions"
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
        kafka={"impressions_topic": f"impressions-{suffix}"},
        passes={"allowed_lateness_seconds": 10, "idle_partition_seconds": 3},
        paths=PathConfig.under(root),
        synthetic={
            "click_delay_seconds": 20,
            "conversion": {"delay_median_seconds": 120, "delay_sigma": 1.5},
        },
    )


@pytest.fixture(scope="module")
def stream(services, build_passes, tmp_path_factory: pytest.TempPathFactory):
    """The two-label passes, built once; the config that built them and their batches."""
    cfg = _config(services, tmp_path_factory.mktemp("tasks"), "model_esmm.yaml")
    batches = build_passes(cfg, FIRST, PASSES)
    return cfg, {p: batches[p] for p in list(batches)[:PASSES]}


def _best(cfg: PipelineConfig, batch) -> dict[str, float]:
    labels = batch.expected_labels(cfg.labels)
    joint = batch.probabilities * batch.conversion_probabilities
    return {
        "click": exact_auc(batch.probabilities, labels["click"]),
        "conversion": exact_auc(joint, labels["conversion"]),
    }


@pytest.mark.parametrize("model", ["model_esmm.yaml", "model_mmoe.yaml"])
def test_each_task_learns_close_to_its_best_auc(stream, model: str, tmp_path: Path) -> None:
    built, batches = stream
    cfg = _config_on(built, model, tmp_path)
    Path(cfg.paths.work_root).mkdir(parents=True, exist_ok=True)
    config = dump_config(cfg, tmp_path / "pipeline.yaml")
    with cli_cluster(config, env={"PYTHONPATH": str(EXAMPLE)}) as client:
        results = [client.train(p) for p in batches]
    gaps: dict[str, list[float]] = {"click": [], "conversion": []}
    for result, batch in zip(results, batches.values(), strict=True):
        assert result.count_matches_manifest
        assert set(result.tasks) == {"conversion"}
        task = result.tasks["conversion"]
        assert task.test.count == result.test.count  # the same rows scored for both heads
        assert task.intercept is not None and result.intercept is not None
        best = _best(cfg, batch)
        gaps["click"].append(best["click"] - result.test.auc)
        gaps["conversion"].append(best["conversion"] - task.test.auc)
    late = {name: float(np.mean(g[FROM:])) for name, g in gaps.items()}
    print(model, {name: np.round(g, 4).tolist() for name, g in gaps.items()}, late)
    assert all(gap < BAR for gap in late.values()), late
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
