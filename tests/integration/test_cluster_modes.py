"""Update modes on a real fleetrun cluster (1 server + 2 workers on loopback): sync.

Sync must be synchronous, not async under another name: after every pass both workers
joined the same number of rounds (one per batch of whichever worker had more) and hold
bit-identical dense parameters, the ones the servers hold. It checkpoints and restores
like async: a SIGKILLed worker mid-pass costs a restart, not a pass trained twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrec.config import PipelineConfig, RunnerConfig, dump_config
from streamrec.contracts.training import TrainResult
from streamrec.passes import pass_dir, read_manifest
from trainers.checkpoints import list_checkpoints
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster

pytestmark = pytest.mark.slow

FIRST = "202607050000"


@pytest.fixture(scope="module")
def stream(make_config, build_passes) -> tuple[PipelineConfig, list[str]]:
    cfg = make_config(join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 6000})
    return cfg, list(build_passes(cfg, FIRST, 3))[:3]


def _sync_config(make_config, stream_cfg: PipelineConfig) -> PipelineConfig:
    # about 12 rounds a pass: the default dense step (0.001, held low against stale async
    # gradients, docs/decisions/) learns too little in three; sync rounds have no staleness
    return make_config(
        join={"mode": "label_in_impression"},
        cluster={"heartbeat_seconds": 0.2},
        paths={"data_root": stream_cfg.paths.data_root},
        model={
            "runner": RunnerConfig(
                sync_mode="sync", batch_size=256, min_batch_size=256, min_batches_per_pass=1
            ),
            "hyper_parameters": {"optimizer": {"learning_rate": 0.005}},
        },
    )


def _assert_synchronous(cfg: PipelineConfig, pass_id: str, fresh: bool = False) -> dict:
    workers = ClusterClient.from_config(cfg).worker_results("train", pass_id)
    assert sorted(workers) == [0, 1], workers
    rounds = [w["sync_rounds"] for w in workers.values()]
    assert rounds[0]["rounds"] == rounds[1]["rounds"] > 0, rounds
    # every round but the idle ones had a batch on that worker
    assert max(r["batches"] for r in rounds) == rounds[0]["rounds"], rounds
    assert rounds[0]["dense_digest"] == rounds[1]["dense_digest"], rounds
    averaged = [w["dense_average"] for w in workers.values()]
    if fresh:  # a fresh model's first pass keeps its last iterate
        assert averaged == [None, None], averaged
        return workers[0]
    # then the pass's mean dense parameters, over every batch of both workers, on each
    assert averaged[0] == averaged[1], averaged
    assert averaged[0]["batches"] == sum(r["batches"] for r in rounds), (averaged, rounds)
    return workers[0]


def test_sync_workers_share_rounds_and_dense_weights(stream, make_config) -> None:
    stream_cfg, passes = stream
    cfg = _sync_config(make_config, stream_cfg)
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        results = [cluster.client.train(p) for p in passes]
    for pass_id, result in zip(passes, results, strict=True):
        rows = read_manifest(pass_dir(cfg.paths.data_root, pass_id)).rows
        assert result.test.count == result.train.count == rows
        assert result.sync_mode == "sync"
        _assert_synchronous(cfg, pass_id, fresh=pass_id == passes[0])
    assert results[-1].test.auc > 0.6  # it learns


def test_sync_restores_after_sigkill_mid_pass(stream, make_config, kill_mid_pass) -> None:
    stream_cfg, passes = stream
    cfg = _sync_config(make_config, stream_cfg)
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        cluster.client.train(passes[0])
        command_id = cluster.client.submit("train", passes[1])
        # at once: a sync pass of this size trains in well under a second
        assert kill_mid_pass(cluster, command_id, passes[1], "TRAINER", into_training_s=0)
        second = TrainResult.from_wire(cluster.client.wait(command_id))
        third = cluster.client.train(passes[2])
    assert not second.already_done and second.checkpoint.kind == "delta"
    saves = [(i.pass_id, i.kind) for i in list_checkpoints(cfg.paths.checkpoint_root)]
    assert saves == list(zip(passes, ["base", "delta", "delta"], strict=True))
    for pass_id, result in zip(passes[1:], [second, third], strict=True):
        _assert_synchronous(cfg, pass_id)
        rows = read_manifest(pass_dir(cfg.paths.data_root, pass_id)).rows
        assert result.test.count == result.train.count == rows
