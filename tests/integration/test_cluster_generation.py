"""The generation the node agents agree on, and the shared-storage check, on a real
redis-server: several nodes seeing one loss make one restart, a generation starts only once
every node has joined with its live agent, and a node that sees other storage than the
first one stops at start with exit 2 naming the key."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streamrec.config import ClusterConfig, derived, dump_config
from streamrec.contracts.cluster import NodeBeat
from streamrec.errors import ConfigError
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.hosts.generation import GenerationStore
from trainers.hosts.shared_storage import MARKER, check_shared_storage


def _beat(node: str, incarnation: str) -> NodeBeat:
    return NodeBeat(
        node=node, address="10.0.0.1", incarnation=incarnation, generation=0, state="waiting"
    )


def test_one_generation_per_loss_and_a_start_only_with_every_live_node(
    make_config,
) -> None:
    cfg = make_config()
    store = GenerationStore(connect(cfg.redis), RedisKeys(cfg.name), ["a", "b"])
    with ThreadPoolExecutor(4) as pool:  # four agents start at once: one first generation
        firsts = list(pool.map(lambda n: store.bump(None, "first start", n), "abab"))
    assert {g.number for g in firsts} == {1} and store.read().state == "forming"

    assert store.join(1, "a", "a-1") and store.join(1, "b", "b-1")
    beats = {"a": _beat("a", "a-1")}
    assert store.start_if_complete(1, beats) is None  # b does not heartbeat
    beats["b"] = _beat("b", "b-0")
    assert store.start_if_complete(1, beats) is None  # b's heartbeat is another agent's
    beats["b"] = _beat("b", "b-1")
    started = store.start_if_complete(1, beats)
    assert started is not None and started.state == "started" and started.started_ms > 0
    assert store.start_if_complete(1, beats) == started  # idempotent
    assert not store.join(1, "c", "c-1")  # too late: it must start a new generation

    with ThreadPoolExecutor(2) as pool:  # both nodes see the same loss
        bumps = list(pool.map(lambda n: store.bump(1, f"{n} saw it", n), "ab"))
    assert {g.number for g in bumps} == {2}
    assert store.bump(1, "late news", "a").number == 2  # a stale view bumps nothing
    assert store.read().cause in {"a saw it", "b saw it"}
    history = store.history()
    assert [h.number for h in history] == [1] and history[0].cause == "first start"

    store.beat(_beat("a", "a-2"), ttl_s=5)
    assert set(store.beats()) == {"a"}
    store.forget("a")
    assert store.beats() == {}


def test_every_node_must_see_the_first_nodes_storage(make_config, tmp_path: Path) -> None:
    cfg = make_config()
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    check_shared_storage(r, keys, cfg.paths, "a", ttl_s=60)  # the first node writes
    for name in ("checkpoint_root", "data_root", "work_root"):
        assert (Path(getattr(cfg.paths, name)) / MARKER).exists()
    check_shared_storage(r, keys, cfg.paths, "b", ttl_s=60)  # same mount: finds it

    elsewhere = derived(
        cfg, "node c's config", paths={"checkpoint_root": tmp_path / "other-mount"}
    ).paths
    with pytest.raises(ConfigError, match=r"paths\.checkpoint_root: .*other-mount on node c"):
        check_shared_storage(r, keys, elsewhere, "c", ttl_s=60, wait_s=1)


def test_streamrec_cluster_on_other_storage_exits_2_naming_the_key(
    make_config, tmp_path: Path
) -> None:
    cluster = ClusterConfig.model_validate(
        {
            "nodes": [
                {"name": "ps", "address": "127.0.0.2", "server_ports": [36000]},
                {"name": "trainer", "address": "127.0.0.3", "worker_ports": [36100]},
            ]
        }
    )
    cfg = make_config(cluster=cluster)
    check_shared_storage(connect(cfg.redis), RedisKeys(cfg.name), cfg.paths, "trainer", 60)
    ps = derived(cfg, "node ps's config", paths={"checkpoint_root": tmp_path / "not-shared"})
    config = dump_config(ps, tmp_path / "ps.yaml")
    cli = str(Path(sys.executable).with_name("streamrec"))
    done = subprocess.run(
        [cli, "cluster", "--config", str(config), "--node", "ps"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "paths.checkpoint_root" in done.stderr and "not-shared on node ps" in done.stderr
