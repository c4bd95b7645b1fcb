"""Stages overlapped (``cluster.follow_passes``), a cluster member SIGKILLed in the middle.

A stream of passes is built once, aside; each pass is then published into a pipeline's
data root (a rename of the complete directory, as the builder's own is) as soon as the
pass before it is exported, so the pass follower trains it while the one before is
packaged and delivered on its thread (a fleetrun cluster, 1 server + 2 workers on
loopback, in this process). The worker or the server is SIGKILLed as the workers start
training a pass: the cluster restarts, restores the newest durable checkpoint (the
predecessor's) and trains the pass again from it. After it: every pass was trained and
saved once, in order; every pass served, in order, each only after its gate decision
passed it. How often a delivery was still running when the next pass's training began is
printed.

The builder (``streamrec build-passes``) is SIGKILLed too, while the follower trains a
pass it built and windows after it stream in (each window is sent once the pass two
before it is trained, and the one after the kill only after it, so the builder reads while
passes train however loaded the machine), and started again a second later: every
produced impression is in exactly one pass, every pass trained once and in order, and
every version served in order after its gate passed it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from train_runs import train_runs

from ops.pass_follower import following
from ops.status import pass_finished
from serving_export.delivery import registry_for
from streaming.producer import (
    ensure_event_topics,
    make_producer,
    messages_for,
    send_messages,
    synthetic_passes,
)
from streamrec.config import PipelineConfig, dump_config
from streamrec.passes import complete_passes, pass_dir, read_manifest
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import restore_chain
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FIRST = "202608010000"
PASSES = 5
KILLED = 2  # the pass whose training the kill lands in: pass 1 is delivered meanwhile


def _until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s: {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stream(make_config, build_passes) -> tuple[PipelineConfig, list[str]]:
    cfg = make_config(join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 20000})
    return cfg, list(build_passes(cfg, FIRST, PASSES))[:PASSES]


@pytest.mark.parametrize("role", ["TRAINER", "PSERVER"])
def test_a_member_killed_while_the_next_pass_trains_loses_and_repeats_nothing(
    stream, make_config, kill_mid_pass, role: str
) -> None:
    source, passes = stream
    cfg = make_config(
        join={"mode": "label_in_impression"},
        cluster={"heartbeat_seconds": 0.2, "follow_passes": True},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
    )
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    client = ClusterClient.from_config(cfg)
    registry = registry_for(cfg)
    served: list[str] = []  # each serving version as it was first seen
    checkpoints: list[str | None] = []  # the restored chain's head, seen at the kill
    stop_watching = threading.Event()

    def watch_serving() -> None:
        while not stop_watching.wait(0.02):
            version = registry.serving_version()
            if version and (not served or served[-1] != version):
                served.append(version)

    def publish(pass_id: str) -> None:
        """The built pass, linked under a temporary name and renamed into place whole."""
        final = pass_dir(cfg.paths.data_root, pass_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{pass_id}.publishing")
        shutil.copytree(pass_dir(source.paths.data_root, pass_id), tmp, copy_function=os.link)
        tmp.rename(final)

    watcher = threading.Thread(target=watch_serving, daemon=True)
    watcher.start()
    try:
        with LocalCluster(cfg, resolved) as cluster, following(cfg, "test"):
            for index, pass_id in enumerate(passes):
                if index:
                    _until(lambda p=passes[index - 1]: client.pass_status(p).export, 120,
                           f"pass {passes[index - 1]} exported")  # fmt: skip
                publish(pass_id)
                if index == KILLED:
                    command_id = _train_command(cfg, pass_id)
                    assert kill_mid_pass(cluster, command_id, pass_id, role, into_training_s=0)
                    checkpoints.append(restore_chain(Path(cfg.paths.checkpoint_root))[-1].pass_id)
            serving = registry.serving_version
            _until(
                lambda: all(pass_finished(client.pass_status(p), serving()) for p in passes),
                180,
                "every pass finished",
            )
    finally:
        stop_watching.set()
        watcher.join(timeout=5)
    # the newest durable checkpoint at the kill was the predecessor's, and the pass killed
    # was saved once after it: one save a pass, in order, each on the one before
    assert checkpoints == [passes[KILLED - 1]]
    chain = restore_chain(Path(cfg.paths.checkpoint_root))
    assert [(c.pass_id, c.seq) for c in chain] == [(p, i) for i, p in enumerate(passes)]
    runs = train_runs(cfg)
    assert {p: len(runs.get(p, [])) for p in passes} == dict.fromkeys(passes, 1), runs
    assert sorted(passes, key=lambda p: runs[p][0]["started_at"]) == passes
    assert served == passes, served  # each in turn: none superseded, none skipped
    statuses = [client.pass_status(p) for p in passes]
    for status in statuses:  # nothing served before its gate passed it
        assert status.gate is not None and status.gate.passed, (status.pass_id, status.gate)
        assert status.delivered is not None and status.delivered.at >= status.train.trained_at
    overlapped = [
        s.pass_id for s, nxt in pairwise(statuses) if s.delivered.at > nxt.train.started_at
    ]
    print(f"{role} killed in pass {passes[KILLED]}; delivered while the next trained: {overlapped}")


def _train_command(cfg: PipelineConfig, pass_id: str) -> str:
    """The id of the follower's train command of ``pass_id``, once it is submitted."""
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    found: list[str] = []

    def submitted() -> bool:
        for key in scan_keys(r, keys.command("*")):
            command = r.hgetall(key)
            if command.get("kind") == "train" and command.get("pass_id") == pass_id:
                found.append(key.rsplit(":", 1)[-1])
                return True
        return False

    _until(submitted, 60, f"the train command of {pass_id}")
    return found[0]


BUILT_FIRST = "202608020000"
AHEAD = 2  # windows sent beyond the newest pass trained


def _training_or_trained(client: ClusterClient, pass_id: str) -> bool:
    states = {w.state for w in client.live_workers()}
    return (
        any(s.startswith(f"train {pass_id}") for s in states) or client.pass_status(pass_id).trained
    )


def test_the_builder_killed_while_passes_train_loses_and_repeats_nothing(
    make_config,
) -> None:
    cfg = make_config(
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 20000},
        cluster={"heartbeat_seconds": 0.2, "follow_passes": True},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
    )
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    client = ClusterClient.from_config(cfg)
    serving = registry_for(cfg).serving_version
    ensure_event_topics(cfg)
    windows, produced = [], set()
    killed = threading.Event()
    log = open(Path(cfg.paths.work_root) / "builder.log", "ab")  # noqa: SIM115
    command = [str(Path(sys.executable).with_name("streamrec")), "build-passes"]
    command += ["--config", str(resolved)]

    def builder() -> subprocess.Popen:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def produce() -> None:
        producer = make_producer(cfg.kafka)
        for index, (pass_id, batch) in enumerate(synthetic_passes(cfg, BUILT_FIRST, PASSES)):
            if index >= AHEAD:
                behind = windows[index - AHEAD]
                _until(lambda p=behind: client.pass_status(p).trained, 300, f"{behind} trained")
            if index == KILLED + AHEAD:
                _until(killed.is_set, 300, "the builder killed")
            send_messages(producer, messages_for(cfg, batch))
            if index < PASSES:  # not the tail that closes the last window
                produced.update(e["event_id"] for e in batch.events)
                windows.append(pass_id)
        producer.close()

    proc = builder()
    try:
        with LocalCluster(cfg, resolved), following(cfg, "test"):
            stream = threading.Thread(target=produce, daemon=True)
            stream.start()
            _until(lambda: len(windows) > KILLED, 120, f"window {KILLED} produced")
            _until(lambda: _training_or_trained(client, windows[KILLED]), 300, "its training")
            built = complete_passes(cfg.paths.data_root)
            proc.kill()
            proc.wait()
            killed.set()
            time.sleep(1)
            proc = builder()
            stream.join(timeout=120)
            _until(
                lambda: all(pass_finished(client.pass_status(p), serving()) for p in windows),
                180,
                "every pass finished",
            )
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    assert len(windows) == PASSES
    print(f"builder killed as {windows[KILLED]} trained, {len(built)} passes complete")
    assert built == windows[: KILLED + 1]  # the later windows were still to come
    seen: dict[str, str] = {}
    for pass_id in windows:
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            for event_id in pq.read_table(directory / part.file)["event_id"].to_pylist():
                assert event_id not in seen, f"{event_id} in {seen[event_id]} and {pass_id}"
                seen[event_id] = pass_id
    assert set(seen) == produced
    runs = train_runs(cfg)
    assert {p: len(runs.get(p, [])) for p in windows} == dict.fromkeys(windows, 1), runs
    assert sorted(windows, key=lambda p: runs[p][0]["started_at"]) == windows
    delivered = [s for p in windows if (s := client.pass_status(p)).delivered is not None]
    assert delivered and delivered[-1].pass_id == windows[-1]
    for status in delivered:  # nothing served before its gate passed it
        assert status.gate is not None and status.gate.passed, (status.pass_id, status.gate)
        assert status.delivered.at >= status.train.trained_at
    assert [s.delivered.at for s in delivered] == sorted(s.delivered.at for s in delivered)
