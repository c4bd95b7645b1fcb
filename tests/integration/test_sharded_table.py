"""One sparse table sharded over two servers on two hosts, saved, restored, shrunk and
served.

Three namespace hosts (``hosts.Network``): ``svc`` runs the broker and redis-server, ``h1``
and ``h2`` each run a server and a worker through ``streamrec cluster``. A one-server cluster
on this machine trains the same passes beside it, as the reference for what the table must
hold. The run (once per module): five passes, each exported, published and delivered; the
cluster's own predictions next to ``streamrec predict``'s for a full and a delta version;
every process of h2 SIGKILLed after pass 3 and its node started again; pass 4 trained on
the restored table (a base save); the daily shrink and save on both clusters.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hosts import Network, can_make_hosts, start_services
from pass_rows import cluster_scores, pass_events

from serving_export import delivery
from serving_export.artifact import artifact_dir, load_sparse
from serving_export.manifest import ArtifactManifest
from serving_export.sparse_table import SparseEmbeddings, newest_wins, read_save
from streaming.pipe_reader import multislot_text
from streamrec.config import (
    ClusterConfig,
    PathConfig,
    PipelineConfig,
    derived,
    dump_config,
    load_config,
    with_services,
)
from streamrec.passes import pass_dir, read_manifest
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import list_checkpoints, restore_chain, saved_keys
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster
from trainers.strategy import saved_value_layout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("streamrec"))
FIRST = "202610010000"
PASSES = 5


@dataclass
class Run:
    """What the module's run left to look at."""

    cfg: PipelineConfig
    one_server: PipelineConfig
    passes: list[str]
    versions: dict[str, ArtifactManifest] = field(default_factory=dict)  # by pass
    cluster_scores: dict[str, np.ndarray] = field(default_factory=dict)
    served_scores: dict[str, np.ndarray] = field(default_factory=dict)
    before_kill: SparseEmbeddings | None = None
    keys_after: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def layout(self) -> dict[str, int]:
        return saved_value_layout(self.cfg.model).to_dict()

    def saves(self, cfg: PipelineConfig | None = None) -> list[Path]:
        root = Path((cfg or self.cfg).paths.checkpoint_root)
        return [root / info.name for info in list_checkpoints(root)]

    def chain_table(self, cfg: PipelineConfig | None = None) -> SparseEmbeddings:
        """The table the newest checkpoint chain rebuilds: its saves, newest value winning."""
        root = Path((cfg or self.cfg).paths.checkpoint_root)
        return newest_wins([read_save(root / c.name, self.layout) for c in restore_chain(root)])


def signs_of_pass(cfg: PipelineConfig, pass_id: str) -> np.ndarray:
    """Every feature sign the pass's rows carry, as the pipe reader hands them to Paddle."""
    directory = pass_dir(cfg.paths.data_root, pass_id)
    slots = len(cfg.feature_schema.sparse)
    signs: set[int] = set()
    for part in read_manifest(directory).parts:
        text = multislot_text(pq.read_table(directory / part.file), cfg.feature_schema)
        for line in text.decode().splitlines():
            words, at = line.split(), 0
            for _ in range(slots):
                count = int(words[at])
                signs.update(int(w) for w in words[at + 1 : at + 1 + count])
                at += 1 + count
    return np.array(sorted(signs), dtype=np.uint64)


def server_keys(save: Path) -> dict[int, np.ndarray]:
    """The keys each server wrote into a save (its ``part-<server>-<shard>`` files)."""
    servers = {int(part.name.split("-")[1]) for part in save.glob("*/part-*-*")}
    return {server: saved_keys(save, server) for server in sorted(servers)}


def _served_scores(config: Path, cfg: PipelineConfig, pass_id: str, tmp: Path) -> np.ndarray:
    """``streamrec predict`` on the pass's rows, with the version serving now."""
    events = tmp / f"{pass_id}.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in pass_events(cfg, pass_id)))
    done = subprocess.run(
        [CLI, "predict", "--config", str(config), "--events", str(events)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return np.array([json.loads(line)["p_click"] for line in done.stdout.splitlines()])


def _config(net: Network, bootstrap: str, redis_url: str, root: Path) -> PipelineConfig:
    h1, h2 = net.hosts["h1"], net.hosts["h2"]
    cfg = with_services(load_config(REPO / "configs" / "pipeline.yaml"), bootstrap, redis_url)
    cluster = ClusterConfig(
        nodes=[
            {"name": "h1", "address": h1.address, "servers": [36000], "workers": [36100]},
            {"name": "h2", "address": h2.address, "servers": [36000], "workers": [36100]},
        ],
        node_timeout_seconds=5.0,
        heartbeat_seconds=1.0,
    )

    return derived(
        cfg,
        "the sharded config",
        name="sharded",
        cluster=cluster,
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 4000},
        checkpoints={"base_every_passes": 3, "keep_bases": 5},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
        serving={"sparse_store": "redis"},
        paths=PathConfig.under(root),
    )


def _one_server(cfg: PipelineConfig, root: Path) -> PipelineConfig:
    return derived(
        cfg,
        "the one-server config",
        name="one-server",
        cluster=ClusterConfig(servers=1),
        paths={"checkpoint_root": root / "one" / "checkpoints", "work_root": root / "one"},
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, build_passes) -> Iterator[Run]:
    if reason := can_make_hosts():
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("sharded")
    with Network(["svc", "h1", "h2"]) as net:
        bootstrap, redis_url, _ = start_services(net.hosts["svc"], root / "logs")
        cfg = _config(net, bootstrap, redis_url, root)
        config = dump_config(cfg, root / "pipeline.yaml")
        passes = list(build_passes(cfg, FIRST, PASSES))[:PASSES]
        one = _one_server(cfg, root)
        state = Run(cfg, one, passes)
        agents = {
            name: net.hosts[name].popen(
                [CLI, "cluster", "--config", str(config)], root / "logs" / f"cluster-{name}.log"
            )
            for name in ("h1", "h2")
        }
        client = ClusterClient.from_config(cfg)
        with LocalCluster(one, dump_config(one, root / "one" / "pipeline.yaml")) as reference:
            _deadline_until(lambda: len(client.live_workers()) == 2, 300)
            for index, pass_id in enumerate(passes[:3]):
                reference.client.train(pass_id)
                trained = client.train(pass_id)
                raw = client.export(pass_id)["raw_export"]
                manifest = delivery.publish(cfg, raw, delivery.evaluate(cfg, trained))
                delivery.deliver(cfg, manifest.version)
                state.versions[pass_id] = manifest
                if index in (0, 2):  # a full version, then a delta on top of a delta
                    state.cluster_scores[pass_id] = cluster_scores(
                        client, pass_id, pass_events(cfg, pass_id)
                    )
                    state.served_scores[pass_id] = _served_scores(config, cfg, pass_id, root)
            state.keys_after["pass 3"] = {
                "sharded": state.chain_table().keys,
                "one server": state.chain_table(one).keys,
            }
            state.before_kill = state.chain_table()
            generation = int(connect(cfg.redis).hget(RedisKeys(cfg.name).cluster_generation, "gen"))
            net.hosts["h2"].kill_all()
            agents["h2"] = net.hosts["h2"].popen(
                [CLI, "cluster", "--config", str(config)], root / "logs" / "cluster-h2-again.log"
            )
            _deadline_until(
                lambda: sum(w["generation"] > generation for w in client.live_workers()) == 2,
                300,
            )
            for pass_id in passes[3:]:
                reference.client.train(pass_id)
                client.train(pass_id)
                if pass_id == passes[3]:
                    reference.client.maintain(pass_id)
                    client.maintain(pass_id)
                    state.keys_after["shrink"] = {
                        "sharded": state.chain_table().keys,
                        "one server": state.chain_table(one).keys,
                    }
        for agent in agents.values():
            agent.terminate()
            agent.wait(60)
        yield state


def _deadline_until(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def test_every_save_is_split_between_both_servers(run: Run) -> None:
    kinds = [json.loads((s / "CHECKPOINT.json").read_text())["kind"] for s in run.saves()]
    assert {"base", "delta", "daily"} <= set(kinds), kinds
    for save in run.saves():
        keys = server_keys(save)
        assert set(keys) == {0, 1}, f"{save.name}: shards of servers {sorted(keys)}"
        assert all(len(k) for k in keys.values()), save.name
        assert not np.intersect1d(keys[0], keys[1]).size, f"{save.name}: a key on both"


def test_the_servers_together_hold_the_keys_one_server_holds(run: Run) -> None:
    for moment, keys in run.keys_after.items():
        assert len(keys["sharded"]) > 0
        np.testing.assert_array_equal(keys["sharded"], keys["one server"], err_msg=moment)


def test_a_delta_version_holds_exactly_the_keys_its_pass_touched(run: Run) -> None:
    third = run.passes[2]
    manifest = run.versions[third]
    assert manifest.sparse.kind == "delta" and manifest.sparse.parent == run.passes[1]
    keys = load_sparse(artifact_dir(run.cfg, third)).keys
    np.testing.assert_array_equal(np.sort(keys), signs_of_pass(run.cfg, third))
    by_server = server_keys(Path(run.cfg.paths.checkpoint_root) / f"{third}-delta")
    assert all(np.intersect1d(keys, k).size for k in by_server.values())


def test_full_and_delta_versions_serve_the_clusters_own_scores(run: Run) -> None:
    kinds = {p: run.versions[p].sparse.kind for p in run.cluster_scores}
    assert list(kinds.values()) == ["full", "delta"]
    for pass_id, expected in run.cluster_scores.items():
        np.testing.assert_allclose(run.served_scores[pass_id], expected, rtol=0, atol=1e-5)


def test_a_restore_after_sigkill_gives_back_every_servers_keys_and_values(run: Run) -> None:
    """Pass 4, trained on the restored table, saves a base: the keys restored plus those
    pass 4 touched, and every key it did not touch with the value the chain saved."""
    assert run.before_kill is not None
    fourth = run.passes[3]
    base = read_save(Path(run.cfg.paths.checkpoint_root) / f"{fourth}-base", run.layout)
    touched = signs_of_pass(run.cfg, fourth)
    np.testing.assert_array_equal(base.keys, np.union1d(run.before_kill.keys, touched))
    untouched = np.setdiff1d(run.before_kill.keys, touched)
    assert len(untouched) > 100
    restored, _ = base.find(untouched)
    saved, _ = run.before_kill.find(untouched)
    np.testing.assert_array_equal(base.values[restored], run.before_kill.values[saved])
