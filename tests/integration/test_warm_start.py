"""A fresh cluster started from another pipeline's model (``streamrec cluster
--warm-start``) scores its first pass exactly as that pipeline, restarted from the same
save, does; a model that does not fit, or a Paddle directory whose rows do not, is exit 2
naming what differs, before anything starts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cli_cluster import CLI, cli_cluster

from streamrec.config import PipelineConfig, dump_config
from trainers.checkpoints import CHECKPOINT_MANIFEST, list_checkpoints
from trainers.launcher import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FIRST = "202608010000"


def _cfg(make_config, data_root: Path | None = None, **model) -> PipelineConfig:
    return make_config(
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 8000},
        **({"paths": {"data_root": data_root}} if data_root else {}),
        **({"model": model} if model else {}),
    )


@pytest.fixture(scope="module")
def source(make_config, build_passes) -> tuple[PipelineConfig, list[str], Path]:
    """A pipeline trained on two passes (base + delta), a third pass built, the save after
    the second."""
    cfg = _cfg(make_config)
    passes = list(build_passes(cfg, FIRST, 3))[:3]
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        for pass_id in passes[:2]:
            cluster.client.train(pass_id)
    saves = list_checkpoints(cfg.paths.checkpoint_root)
    assert [s.pass_id for s in saves] == passes[:2] and saves[-1].model is not None
    return cfg, passes, Path(cfg.paths.checkpoint_root) / saves[-1].name


def test_a_warm_started_pipeline_scores_its_first_pass_as_the_source_would(
    make_config, source: tuple[PipelineConfig, list[str], Path]
) -> None:
    cfg, passes, after_two = source
    # the source itself, restarted from that save (before the other test copies it)
    resolved = Path(cfg.paths.work_root) / "pipeline.yaml"
    with LocalCluster(cfg, resolved) as cluster:
        expected = cluster.client.train(passes[2])

    fresh = _cfg(make_config, data_root=cfg.paths.data_root)
    config = dump_config(fresh, Path(fresh.paths.work_root) / "pipeline.yaml")
    with cli_cluster(config, "--warm-start", str(after_two)) as client:
        got = client.train(passes[2])
    assert expected.test is not None and got.test is not None
    assert got.test.count == expected.test.count
    assert got.test.auc == pytest.approx(expected.test.auc, abs=1e-9)
    assert got.test.logloss == pytest.approx(expected.test.logloss, rel=1e-6)
    assert got.test.auc > 0.6, got.test  # a trained model's, not a random one's
    own = list_checkpoints(fresh.paths.checkpoint_root)
    assert [(s.pass_id, s.kind, s.seq) for s in own] == [(passes[2], "base", 0)]
    assert own[0].model == list_checkpoints(cfg.paths.checkpoint_root)[1].model


@pytest.mark.parametrize(
    ("model", "paddle_dir", "named"),
    [
        (
            {"hyper_parameters": {"sparse_feature_dim": 5}},
            False,
            "sparse table SparseFeatFactors: saved dim 9, rule adagrad, row_width 17, "
            "table_id 0, configured dim 5",
        ),
        ({"hyper_parameters": {"fc_sizes": [32]}}, False, "dense parameter dnn.fc1.w is in the"),
        (
            {"hyper_parameters": {"sparse_feature_dim": 5}},
            True,
            "SparseFeatFactors (folder 000): rows have 17 columns, this model's 13",
        ),
        ({"hyper_parameters": {"fc_sizes": [32]}}, True, "dense values saved, this network has"),
    ],
)
def test_a_model_that_does_not_fit_is_exit_2_naming_what_differs(
    make_config,
    source: tuple[PipelineConfig, list[str], Path],
    tmp_path: Path,
    model: dict,
    paddle_dir: bool,
    named: str,
) -> None:
    cfg, _, after_two = source
    start = after_two
    if paddle_dir:  # what fleet.save_persistables writes: the tables, no CHECKPOINT.json
        start = tmp_path / "paddle-save"
        shutil.copytree(after_two, start, ignore=shutil.ignore_patterns(CHECKPOINT_MANIFEST))
        assert list_checkpoints(tmp_path) == []
    other = _cfg(make_config, data_root=cfg.paths.data_root, **model)
    config = dump_config(other, Path(other.paths.work_root) / "pipeline.yaml")
    done = subprocess.run(
        [CLI, "cluster", "--config", str(config), "--warm-start", str(start)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "checkpoints.warm_start" in done.stderr and named in done.stderr, done.stderr[-3000:]
