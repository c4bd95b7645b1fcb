"""Checkpoints and restore on a real fleetrun cluster (1 server + 2 workers on loopback).

One stream of four passes is built once. An uninterrupted run trains passes 1-3 and
measures the progressive AUC of pass 4. Runs that SIGKILL the server, or a worker, in the
middle of pass 2 restart the cluster (which restores base + deltas), finish pass 2 exactly
once and must measure the same AUC on pass 4 (within 0.01 of an uninterrupted run's: a
second one is run when the first is further off, as async training varies that much from
run to run); so must a cluster restarted between passes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamrec.config import PipelineConfig, dump_config
from streamrec.contracts.training import TrainResult
from streamrec.passes import pass_dir, read_manifest
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import list_checkpoints
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FIRST = "202607010000"
AUC_TOLERANCE = 0.01


@dataclass
class Run:
    results: dict[str, TrainResult]  # by pass id
    restarted: bool


@pytest.fixture(scope="module")
def stream(make_config, build_passes) -> tuple[PipelineConfig, list[str]]:
    cfg = make_config(join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 20000})
    return cfg, list(build_passes(cfg, FIRST, 4))[:4]


def _fresh(make_config, stream_cfg: PipelineConfig) -> PipelineConfig:
    """A new pipeline (Redis prefix, checkpoints) reading the shared stream's passes."""
    # frequent heartbeats: the kill waits to see the workers' state switch to the pass
    return make_config(
        join={"mode": "label_in_impression"},
        cluster={"heartbeat_seconds": 0.2},
        paths={"data_root": stream_cfg.paths.data_root},
    )


def _run(cfg: PipelineConfig, passes: list[str], kill: Callable[..., bool] | None = None) -> Run:
    """Train passes 1-3 and score 4; ``kill(cluster, command_id, pass_id)`` during pass 2."""
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    results: dict[str, TrainResult] = {}
    restarted = False
    with LocalCluster(cfg, resolved) as cluster:
        for index, pass_id in enumerate(passes[:3]):
            command_id = cluster.client.submit("train", pass_id)
            if kill and index == 1:
                restarted = kill(cluster, command_id, pass_id)
            results[pass_id] = TrainResult.from_wire(cluster.client.wait(command_id))
        results[passes[3]] = cluster.client.train(passes[3])
    print({p: (r.seconds, r.test.auc) for p, r in results.items()})
    return Run(results, restarted)


@pytest.fixture(scope="module")
def uninterrupted(stream, make_config) -> Run:
    cfg, passes = stream
    return _run(_fresh(make_config, cfg), passes)


def _assert_trained_once(cfg: PipelineConfig, run: Run, passes: list[str]) -> None:
    client = ClusterClient.from_config(cfg)
    for pass_id in passes:
        rows = read_manifest(pass_dir(cfg.paths.data_root, pass_id)).rows
        trained = client.pass_status(pass_id).train
        assert trained is not None and trained.test.count == trained.train.count == rows, pass_id
        assert not run.results[pass_id].already_done, pass_id


def _assert_auc_as_uninterrupted(
    run: Run, uninterrupted: Run, pass_id: str, make_config, stream
) -> None:
    """The progressive AUC on ``pass_id`` is within 0.01 of the uninterrupted run's, or of a
    second uninterrupted run's: async training varies by about that much between runs (a
    CI run measured 0.8094, 0.8049 and 0.7990 uninterrupted, 0.7989 and 0.7969 restored),
    so one reference alone can be the outlier."""
    after = run.results[pass_id].test.auc
    reference = uninterrupted.results[pass_id].test.auc
    if abs(after - reference) > AUC_TOLERANCE:  # is it more than run-to-run noise?
        stream_cfg, passes = stream
        second = _run(_fresh(make_config, stream_cfg), passes).results[pass_id].test.auc
        assert abs(after - second) <= AUC_TOLERANCE, (after, reference, second)


@pytest.mark.parametrize("role", ["PSERVER", "TRAINER"])
def test_sigkill_mid_pass_restores_and_trains_the_pass_once(
    stream, make_config, kill_mid_pass, uninterrupted: Run, role: str
) -> None:
    stream_cfg, passes = stream
    cfg = _fresh(make_config, stream_cfg)
    run = _run(cfg, passes, kill=lambda *command: kill_mid_pass(*command, role))
    assert run.restarted
    _assert_trained_once(cfg, run, passes)
    # the restart restored pass 1's base and trained pass 2 on top of it, as a delta
    saves = [(i.pass_id, i.kind) for i in list_checkpoints(cfg.paths.checkpoint_root)]
    assert saves == list(zip(passes, ["base", "delta", "delta", "delta"], strict=True))
    _assert_auc_as_uninterrupted(run, uninterrupted, passes[3], make_config, stream)


def test_uninterrupted_run_checkpoints_every_pass(stream, uninterrupted: Run) -> None:
    _, passes = stream
    for pass_id in passes:
        checkpoint = uninterrupted.results[pass_id].checkpoint
        assert checkpoint.name == f"{pass_id}-{'base' if pass_id == passes[0] else 'delta'}"
        assert 0 < checkpoint.saved_keys <= checkpoint.table_keys
    keys = [uninterrupted.results[p].checkpoint.table_keys for p in passes]
    assert keys == sorted(keys)  # no eviction configured: the table only grows
    assert uninterrupted.results[passes[3]].test.auc > 0.65


def test_commands_are_idempotent_across_restarts(stream, make_config) -> None:
    """A repeated train command is acknowledged without training; after a restart (and with
    its done marker lost, as in a crash between the save and the marker) the restored
    checkpoint still says the pass is in the model."""
    stream_cfg, passes = stream
    cfg = _fresh(make_config, stream_cfg)
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        first = cluster.client.train(passes[0])
        again = cluster.client.train(passes[0])
        assert again.already_done and again.test == first.test
        cluster.restart()
        r = connect(cfg.redis)
        r.delete(RedisKeys(cfg.name).done("train", passes[0]))
        replay = cluster.client.train(passes[0])
        assert replay.already_done and replay.already_in_model == f"{passes[0]}-base"
        assert replay.test == first.test
        assert r.exists(RedisKeys(cfg.name).done("train", passes[0]))  # marker rewritten
        second = cluster.client.train(passes[1])
        assert not second.already_done and second.checkpoint.kind == "delta"


def test_restart_between_passes_restores_base_and_delta(stream, make_config, uninterrupted: Run):
    """Stop after two passes (a base and a delta), start again: pass 3 scores like the
    uninterrupted run, so both saves (sparse and dense) came back."""
    stream_cfg, passes = stream
    cfg = _fresh(make_config, stream_cfg)
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        for pass_id in passes[:2]:
            cluster.client.train(pass_id)
        cluster.restart()
        third = cluster.client.train(passes[2])
    assert third.checkpoint.name == f"{passes[2]}-delta"
    restarted = Run({passes[2]: third}, restarted=True)
    _assert_auc_as_uninterrupted(restarted, uninterrupted, passes[2], make_config, stream)
