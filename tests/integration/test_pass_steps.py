"""Steps of the open pass (``passes.step_seconds``) on the real broker: each published step
is final, its rows are in the pass once, and a builder SIGKILLed between and during steps
loses and repeats nothing; the cluster's pass follower trains each step as it comes, and a
worker SIGKILLed after it trained steps of a pass makes the restarted cluster train that
whole pass from the save before it, once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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
from streamrec.layout import DataLayout
from streamrec.passes import (
    PassClock,
    complete_passes,
    pass_dir,
    read_manifest,
    read_slice,
    read_step,
    slice_dir,
    slices_root,
)
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import restore_chain
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster

pytestmark = pytest.mark.slow

FIRST = "202605010000"
PASSES = 6
KILLS = 3  # a killed builder's partitions wait out the group's session (6 s): then it runs
RATE = 600  # events a second: a step of 800 events every 1.3 s, as a live stream has them


def _config(make_config, **sections) -> PipelineConfig:
    cluster = {"follow_passes": True, **sections.pop("cluster", {})}
    return make_config(
        synthetic={"events_per_pass": 4000},
        join={"mode": "label_in_impression"},
        passes={
            "idle_partition_seconds": 3,
            "parts_per_pass": 2,
            # longer than a step: a step is cut while the next window's rows are held, so a
            # restart replays rows of the window below its newest step's read point
            "allowed_lateness_seconds": 150,
            "step_seconds": 120,
            "join_memory_mib": None,
        },
        kafka={"session_timeout_ms": 6000},
        cluster=cluster,
        **sections,
    )


def _last() -> str:
    last = FIRST
    for _ in range(PASSES - 1):
        last = PassClock(600).next(last)
    return last


def _builder(config_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streaming.pass_builder",
            "--config",
            str(config_path),
            "--until-pass",
            _last(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _published(cfg: PipelineConfig) -> int:
    """Steps and slices published so far."""
    root = slices_root(cfg.paths.data_root)
    return len(list(root.glob("*/*/steps/p*/*/_SUCCESS"))) + len(list(root.glob("*/*/p*/_SUCCESS")))


def _writing(cfg: PipelineConfig) -> bool:
    return any(slices_root(cfg.paths.data_root).glob("*/*/steps/p*/.*.tmp-*"))


def _pass_rows(cfg: PipelineConfig) -> dict[str, tuple[str, int]]:
    """event_id -> (pass id, label) over every complete pass; no event twice."""
    seen: dict[str, tuple[str, int]] = {}
    for pass_id in complete_passes(cfg.paths.data_root):
        directory = pass_dir(cfg.paths.data_root, pass_id)
        manifest = read_manifest(directory)
        rows = 0
        for part in manifest.parts:
            table = pq.read_table(directory / part.file, columns=["event_id", "label"])
            rows += table.num_rows
            for event_id, label in zip(*table.to_pydict().values(), strict=True):
                assert event_id not in seen, f"{event_id} in {seen[event_id][0]} and {pass_id}"
                seen[event_id] = (pass_id, label)
        assert rows == manifest.rows
    return seen


def _produce(
    cfg: PipelineConfig, batches: dict, before: Callable[[int], object] | None = None
) -> None:
    """Send the windows at ``RATE``; ``before(i)`` returns when window ``i`` may go."""
    producer = make_producer(cfg.kafka)
    try:
        for index, batch in enumerate(batches.values()):
            if before is not None:
                before(index)
            send_messages(producer, messages_for(cfg, batch), rate=RATE)
    finally:
        producer.close()


def test_sigkilled_builder_publishes_every_event_once_in_steps(make_config, tmp_path) -> None:
    cfg = _config(make_config)
    ensure_event_topics(cfg)
    batches = dict(synthetic_passes(cfg, FIRST, PASSES))
    # the windows after the first three wait for the kills: a builder killed and started
    # again (6 s of the group's session each) must not let the stream end first
    killed = threading.Event()
    producing = threading.Thread(
        target=_produce,
        args=(cfg, batches, lambda i: i != 3 or killed.wait(300)),
        daemon=True,
    )
    producing.start()
    expected = {
        e["event_id"]: int(label)
        for batch in list(batches.values())[:PASSES]
        for e, label in zip(batch.events, batch.labels, strict=True)
    }
    config_path = dump_config(cfg, tmp_path / "cfg.yaml")
    rng, kills, deadline = random.Random(11), 0, time.monotonic() + 400
    while not (pass_dir(cfg.paths.data_root, _last()) / "_SUCCESS").exists():
        assert time.monotonic() < deadline, "the builder did not finish"
        proc = _builder(config_path)
        if kills < KILLS:
            target, mid_write = _published(cfg) + rng.randint(1, 2), rng.random() < 0.5
            # with the stream held, a write to land in may not come: then kill after 10 s
            until = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < until:
                if _published(cfg) >= target and (not mid_write or _writing(cfg)):
                    break
                time.sleep(0.002)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            if kills == KILLS:
                killed.set()
        assert proc.wait(timeout=300) in (0, -signal.SIGKILL), proc.stderr.read().decode()[-2000:]
    assert kills == KILLS
    producing.join(timeout=60)
    assert not producing.is_alive()
    assert {e: label for e, (_, label) in _pass_rows(cfg).items()} == expected
    # the passes were written in steps: each slice holds its steps' parts and counts them
    root, stepped = Path(cfg.paths.data_root), []
    layout = DataLayout(root)
    for pass_id in complete_passes(root):
        for partition in range(read_manifest(pass_dir(root, pass_id)).partitions):
            folder = slice_dir(root, pass_id, partition)
            if not (folder / "_SUCCESS").exists():
                continue
            piece = read_slice(folder)
            steps = [read_step(layout.step_dir(pass_id, partition, k)) for k in piece.steps]
            stepped.append(len(steps))
            assert piece.steps == sorted(piece.steps) and all(0 < k < 5 for k in piece.steps)
            own = sum(p.rows for p in piece.parts if not p.file.startswith("s"))
            assert piece.rows == own + sum(s.rows for s in steps)
    # a builder that runs (not one catching up after a kill) writes every step of a window
    assert stepped.count(4) >= 4, stepped


def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s: {what}"
        time.sleep(0.05)


def _steps_trained(cfg: PipelineConfig, pass_id: str) -> bool:
    """Whether a train_steps command of ``pass_id`` trained rows."""
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    for key in scan_keys(r, keys.command("*")):
        command = r.hgetall(key)
        mine = command.get("kind") == "train_steps" and command.get("pass_id") == pass_id
        if mine and command.get("status") == "done" and json.loads(command["result"])["rows"]:
            return True
    return False


KILLED = 2  # the pass whose steps the killed worker had trained


@pytest.mark.timeout(600)
def test_steps_train_as_they_come_and_a_killed_worker_retrains_its_pass(
    make_config, tmp_path
) -> None:
    cfg = _config(
        make_config,
        cluster={"heartbeat_seconds": 0.2},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
    )
    ensure_event_topics(cfg)
    batches = dict(synthetic_passes(cfg, FIRST, PASSES))
    windows = list(batches)[:PASSES]
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    client, serving = ClusterClient.from_config(cfg), registry_for(cfg).serving_version
    log = open(tmp_path / "builder.log", "ab")  # noqa: SIM115
    builder = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("streamrec")),
            "build-passes",
            "--config",
            str(resolved),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with LocalCluster(cfg, resolved) as cluster, following(cfg, "test"):

            def paced(index: int) -> None:
                """Window i goes once steps of pass i - 1 have trained: the follower, its
                pass before done, waits for the next one however loaded the machine."""
                if index >= 2:
                    earlier = windows[index - 1]
                    _until(lambda: _steps_trained(cfg, earlier), 300, f"steps of {earlier}")

            producing = threading.Thread(target=_produce, args=(cfg, batches, paced), daemon=True)
            producing.start()
            _until(lambda: _steps_trained(cfg, windows[KILLED]), 300, "steps of the pass trained")
            assert not (pass_dir(cfg.paths.data_root, windows[KILLED]) / "_SUCCESS").exists()
            head = restore_chain(Path(cfg.paths.checkpoint_root))[-1].pass_id
            cluster.members("TRAINER")[-1].send_signal(signal.SIGKILL)
            _until(lambda: not cluster.healthy, 30, "the launcher sees the worker gone")
            assert cluster.ensure_healthy()
            producing.join(timeout=120)
            _until(
                lambda: all(pass_finished(client.pass_status(p), serving()) for p in windows),
                300,
                "every pass finished",
            )
    finally:
        builder.terminate()
        builder.wait(60)
        log.close()
    assert head == windows[KILLED - 1]  # the killed worker had not trained the pass through
    chain = restore_chain(Path(cfg.paths.checkpoint_root))
    assert [c.pass_id for c in chain] == windows  # one save a pass, in order
    runs = train_runs(cfg)
    assert {p: len(runs.get(p, [])) for p in windows} == dict.fromkeys(windows, 1), runs
    statuses = [client.pass_status(p) for p in windows]
    in_steps = {s.pass_id: s.train.rows_in_steps for s in statuses}
    for status in statuses:  # every row trained once: the steps' and the pass's add up
        assert status.train.count_matches_manifest, status.pass_id
        assert status.train.train.count == status.train.rows
        assert status.gate is not None and status.gate.passed
        if status.delivered is None:  # the next pass was complete by then: served with it
            assert status.superseded is not None and status.superseded.delivers, status
        else:
            assert status.delivered.at >= status.train.trained_at
    assert statuses[-1].delivered is not None
    # the first pass has no pass before it to follow; the killed one lost the steps trained
    # before the kill (its own command trained them again), the later ones came after it;
    # every other pass was mostly trained before its window closed
    assert in_steps[windows[0]] == 0, in_steps
    assert in_steps[windows[KILLED]] < statuses[KILLED].train.rows, in_steps
    for status in statuses[1:KILLED] + statuses[KILLED + 1 :]:
        assert in_steps[status.pass_id] >= status.train.rows // 2, in_steps
        assert status.train.seconds_in_steps["train"] > 0
