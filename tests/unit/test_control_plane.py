"""The control plane: which ``stop`` commands a starting cluster obeys (pure logic), and
how long a worker's heartbeat lives (on a real redis-server)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from streamrec.config import RedisConfig
from streamrec.contracts.pass_status import read_status
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import WORKER, Command, WorkerChannel
from trainers.worker.worker_context import blocking_hold_s

STARTED_MS = 1_700_000_000_000


@pytest.fixture
def channel() -> WorkerChannel:
    # no Redis: stale_stop reads only the command and the start time
    return WorkerChannel(None, RedisKeys("t"), 0, 1.0, started_ms=STARTED_MS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "sent_ms", "stale"),
    [
        ("stop", STARTED_MS - 1, True),  # sent to the run that was killed before reading it
        ("stop", STARTED_MS, False),
        ("stop", STARTED_MS + 5_000, False),  # sent to this run
        ("train", STARTED_MS - 60_000, False),  # queued work is resumed, never skipped
    ],
)
def test_only_a_stop_sent_before_the_start_is_stale(
    channel: WorkerChannel, kind: str, sent_ms: int, stale: bool
) -> None:
    command = Command("c1", kind, "", f"{sent_ms}-0")  # type: ignore[arg-type]
    assert channel.stale_stop(command) is stale


def test_a_cluster_started_without_a_start_time_obeys_every_stop() -> None:
    channel = WorkerChannel(None, RedisKeys("t"), 0, 1.0)  # type: ignore[arg-type]
    assert not channel.stale_stop(Command("c1", "stop", "", "1-0"))


def test_a_blocking_stage_heartbeat_outlives_the_call(services) -> None:
    """Paddle's save and shrink hold the GIL, so the heartbeat thread is silent for all of
    a save (63 s for 10M keys here): the heartbeat sent as it starts lives that long, and
    the next stage's is short again."""
    r = connect(RedisConfig(url=services.redis_url))
    keys = RedisKeys(f"hold-{time.time_ns()}")
    channel = WorkerChannel(r, keys, 0, 1.0)
    channel.set_state("maintain 202601010000")
    assert 0 < r.ttl(keys.heartbeat(WORKER, 0)) <= 4
    channel.set_stage("save", hold_s=blocking_hold_s(16_000_000))
    assert r.ttl(keys.heartbeat(WORKER, 0)) > 5 * 6.4 * 16  # 5x the measured base save
    channel.start_heartbeat()  # its beats before the call blocks keep the hold
    time.sleep(2.5)
    assert r.ttl(keys.heartbeat(WORKER, 0)) > 5 * 6.4 * 16
    channel.set_stage("publish")
    assert 0 < r.ttl(keys.heartbeat(WORKER, 0)) <= 4
    channel.stop_heartbeat()


class _SlowHeartbeatThread:
    """A Redis client whose SETs from the heartbeat thread take 0.3 s to land, as a beat's
    can on a loaded machine."""

    def __init__(self, r: Any) -> None:
        self._r = r

    def set(self, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "heartbeat":
            time.sleep(0.3)
        return self._r.set(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)


def test_a_heartbeat_under_way_never_overwrites_a_newer_stage(services) -> None:
    """The heartbeat thread reads the state, then sends it; a stage set meanwhile is sent
    after it, never before (the old stage would show for all of the new one), and no beat
    revives the heartbeat after the stop."""
    r = connect(RedisConfig(url=services.redis_url))
    keys = RedisKeys(f"order-{time.time_ns()}")
    channel = WorkerChannel(_SlowHeartbeatThread(r), keys, 0, 30.0)  # type: ignore[arg-type]
    channel.set_state("train 202601010000")
    channel.set_stage("test")
    channel.start_heartbeat()  # its first beat carries "test" and lands 0.3 s later
    time.sleep(0.1)
    channel.set_stage("train")
    time.sleep(0.5)
    assert json.loads(r.get(keys.heartbeat(WORKER, 0)))["state"] == "train 202601010000: train"
    channel.stop_heartbeat()
    assert not r.exists(keys.heartbeat(WORKER, 0))


def test_every_worker_reads_the_command_after_the_one_the_cluster_recorded(
    services, train_result
) -> None:
    """One cursor for the cluster, moved in the transaction that records a command: until
    worker 0 records it, every worker reads that command again (a kill before the record
    re-runs it on all of them); once it is recorded, every worker reads the next one."""
    r = connect(RedisConfig(url=services.redis_url))
    keys = RedisKeys(f"cursor-{time.time_ns()}")
    leader, other = (WorkerChannel(r, keys, rank, 1.0) for rank in (0, 1))
    ids = [
        r.xadd(keys.commands, {"id": f"c{i}", "kind": "train", "pass_id": f"p{i}"}) for i in (1, 2)
    ]
    first = leader.next_command(block_ms=10)
    assert first is not None and first.id == "c1"
    reply = train_result("p1").to_wire()
    leader.acknowledge(first, reply)
    assert [leader.next_command(10).id, other.next_command(10).id] == ["c1", "c1"]
    leader.record(first, reply, None)
    assert r.get(keys.cursor) == ids[0]
    assert r.exists(keys.done("train", "p1")) and r.hget(keys.command("c1"), "status") == "done"
    assert [leader.next_command(10).id, other.next_command(10).id] == ["c2", "c2"]


def test_a_reply_is_recorded_on_the_pass_once_and_a_broken_one_fails_its_command(
    services, train_result
) -> None:
    """The pass status holds the first reply; a re-sent command's stored reply does not
    overwrite it, one the restored model gave (its marker lost) does, and a reply that
    breaks its contract fails the command naming the field, leaving the status alone."""
    r = connect(RedisConfig(url=services.redis_url))
    keys = RedisKeys(f"record-{time.time_ns()}")
    leader = WorkerChannel(r, keys, 0, 1.0)
    first = train_result("p1", auc=0.7)
    leader.record(Command("c1", "train", "p1", "1-0"), first.to_wire(), None)
    assert read_status(r, keys, "p1").train == first
    again = first.model_copy(update={"already_done": True, "test": first.train})
    leader.record(Command("c2", "train", "p1", "2-0"), again.to_wire(), None)
    assert read_status(r, keys, "p1").train == first and r.get(keys.done("train", "p1")) == "c1"
    restored = again.model_copy(update={"already_in_model": "p1-base"})
    leader.record(Command("c3", "train", "p1", "3-0"), restored.to_wire(), None)
    assert read_status(r, keys, "p1").train == restored

    broken = {k: v for k, v in train_result("p2").to_wire().items() if k != "rows"}
    leader.record(Command("c4", "train", "p2", "4-0"), broken, None)
    assert r.hget(keys.command("c4"), "status") == "failed"
    assert "rows" in r.hget(keys.command("c4"), "error")
    assert read_status(r, keys, "p2").train is None and not r.exists(keys.done("train", "p2"))
