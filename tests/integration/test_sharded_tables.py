"""Two sparse tables, each sharded over two servers on two hosts, saved, restored, shrunk
and served: the ids (user_id, item_id) at 16 dims with eviction by score at the daily
shrink, the small slots (category, hour, tags) in a table of their own at 4 dims without.

Three namespace hosts (``hosts.Network``): ``svc`` runs the broker and redis-server, ``h1``
and ``h2`` each run a server and a worker through ``streamrec cluster``. A one-server cluster
on this machine trains the same passes beside it, as the reference for what the table must
hold. The run (once per module): five passes, each exported, published and delivered; the
cluster's own predictions next to ``streamrec predict``'s for a full and a delta version;
every process of h2 SIGKILLed after pass 3 and its node started again; pass 4 trained on
the restored table (a base save); the daily shrink and save on both clusters.
"""

from __future__ import annotations

import gzip
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
from serving_export.predictor import Predictor
from serving_export.sparse_store import RedisStore
from serving_export.sparse_table import SparseEmbeddings, newest_wins, read_save
from streaming.pipe_reader import multislot_text
from streamrec.config import (
    DEFAULT_SPARSE_TABLE,
    ClusterConfig,
    PathConfig,
    PipelineConfig,
    SparseTableSpec,
    derived,
    dump_config,
    load_config,
    sparse_tables,
    with_services,
)
from streamrec.passes import pass_dir, read_manifest
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import CheckpointInfo, list_checkpoints, restore_chain, saved_keys
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster
from trainers.worker.strategy import saved_row_width, saved_value_layout, table_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("streamrec"))
FIRST = "202610010000"
PASSES = 5
SMALL = "small"
SMALL_SLOTS = ["category", "hour", "tags"]
TABLES = {
    "sparse_feature_dim": 16,
    # the daily shrink deletes ids whose decayed show/click score is below 0.5 (a key shown
    # fewer than 5 times without a click); the small table keeps every key
    "sparse_table": {"delete_threshold": 0.5},
    "sparse_tables": {SMALL: {"dim": 4, "slots": SMALL_SLOTS}},
}


@dataclass
class Run:
    """What the module's run left to look at."""

    cfg: PipelineConfig
    one_server: PipelineConfig
    passes: list[str]
    versions: dict[str, ArtifactManifest] = field(default_factory=dict)  # by pass
    cluster_scores: dict[str, np.ndarray] = field(default_factory=dict)
    served_scores: dict[str, np.ndarray] = field(default_factory=dict)
    redis_scores: dict[str, np.ndarray] = field(default_factory=dict)  # from the Redis store
    before_kill: dict[str, SparseEmbeddings] = field(default_factory=dict)  # by table
    keys_after: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)

    @property
    def tables(self) -> dict[str, SparseTableSpec]:
        return sparse_tables(self.cfg.feature_schema, self.cfg.model)

    def saves(self, cfg: PipelineConfig | None = None) -> list[Path]:
        root = Path((cfg or self.cfg).paths.checkpoint_root)
        return [root / info.name for info in list_checkpoints(root)]

    def chain_tables(self, cfg: PipelineConfig | None = None) -> dict[str, SparseEmbeddings]:
        """The tables the newest checkpoint chain rebuilds: its saves, newest value winning;
        each read from the folder its save's signature records for it."""
        root = Path((cfg or self.cfg).paths.checkpoint_root)
        chain = restore_chain(root)
        return {
            name: newest_wins([read_table(root / c.name, c, table) for c in chain])
            for name, table in self.tables.items()
        }


def read_table(save: Path, info: CheckpointInfo, table: SparseTableSpec) -> SparseEmbeddings:
    """``table`` in a save, read from the folder the save's signature records for it."""
    assert info.model is not None
    folder = table_folder(info.model.sparse_tables[table.name].table_id)
    return read_save(save, folder, saved_value_layout(table).to_dict())


def signs_of_pass(cfg: PipelineConfig, pass_id: str, slots: list[str]) -> np.ndarray:
    """Every feature sign the pass's rows carry in ``slots``, as the pipe reader hands them
    to Paddle."""
    directory = pass_dir(cfg.paths.data_root, pass_id)
    names = [s.name for s in cfg.feature_schema.sparse]
    signs: set[int] = set()
    for part in read_manifest(directory).parts:
        text = multislot_text(pq.read_table(directory / part.file), cfg.feature_schema)
        for line in text.decode().splitlines():
            words, at = line.split(), 0
            for name in names:
                count = int(words[at])
                if name in slots:
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


def _redis_scores(cfg: PipelineConfig, pass_id: str) -> np.ndarray:
    """The pass's rows scored with each table's embeddings from the Redis store, which
    delivery wrote a hash per version and table into."""
    store = RedisStore.from_config(
        cfg.redis, RedisKeys(cfg.name), cfg.model.model, artifact_dir(cfg, pass_id).parent
    )
    predictor = Predictor(artifact_dir(cfg, pass_id), store.embeddings_for(pass_id))
    return predictor.score(pass_events(cfg, pass_id))


def _config(net: Network, bootstrap: str, redis_url: str, root: Path) -> PipelineConfig:
    h1, h2 = net.hosts["h1"], net.hosts["h2"]
    cfg = with_services(load_config(REPO / "configs" / "pipeline.yaml"), bootstrap, redis_url)
    cluster = ClusterConfig(
        nodes=[
            {"name": "h1", "address": h1.address, "server_ports": [36000], "worker_ports": [36100]},
            {"name": "h2", "address": h2.address, "server_ports": [36000], "worker_ports": [36100]},
        ],
        node_timeout_seconds=5.0,
        heartbeat_seconds=1.0,
        follow_passes=False,  # the test sends the cluster its commands
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
        model={"hyper_parameters": TABLES},
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
                raw = client.export(pass_id).raw_export
                manifest = delivery.publish(cfg, raw, delivery.evaluate(cfg, trained))
                delivery.deliver(cfg, manifest.version)
                state.versions[pass_id] = manifest
                if index in (0, 2):  # a full version, then a delta on top of a delta
                    state.cluster_scores[pass_id] = cluster_scores(
                        client, pass_id, pass_events(cfg, pass_id)
                    )
                    state.served_scores[pass_id] = _served_scores(config, cfg, pass_id, root)
                    state.redis_scores[pass_id] = _redis_scores(cfg, pass_id)
            state.keys_after["pass 3"] = _keys(state)
            state.before_kill = state.chain_tables()
            generation = int(connect(cfg.redis).hget(RedisKeys(cfg.name).cluster_generation, "gen"))
            net.hosts["h2"].kill_all()
            agents["h2"] = net.hosts["h2"].popen(
                [CLI, "cluster", "--config", str(config)], root / "logs" / "cluster-h2-again.log"
            )
            _deadline_until(
                lambda: sum(w.generation > generation for w in client.live_workers()) == 2,
                300,
            )
            for pass_id in passes[3:]:
                reference.client.train(pass_id)
                client.train(pass_id)
                if pass_id == passes[3]:
                    state.keys_after["pass 4"] = _keys(state)
                    reference.client.maintain(pass_id)
                    client.maintain(pass_id)
                    state.keys_after["shrink"] = _keys(state)
        for agent in agents.values():
            agent.terminate()
            agent.wait(60)
        yield state


def _keys(state: Run) -> dict[str, dict[str, np.ndarray]]:
    """Each table's keys in the newest chain of the sharded and the one-server cluster."""
    sharded, one = state.chain_tables(), state.chain_tables(state.one_server)
    return {name: {"sharded": sharded[name].keys, "one server": one[name].keys} for name in sharded}


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


def test_each_table_is_saved_in_its_folder_at_its_width(run: Run) -> None:
    """Every save holds both tables, each in the folder its id names, with rows as wide as
    its dim and rule make them; the dense table follows them."""
    for save in run.saves():
        info = CheckpointInfo.model_validate_json((save / "CHECKPOINT.json").read_text())
        assert info.model is not None
        shapes = info.model.sparse_tables
        assert sorted(shapes) == sorted(run.tables)
        # the ids Paddle gave, as the start check predicts them (by first lookup)
        assert {name: s.table_id for name, s in shapes.items()} == {
            DEFAULT_SPARSE_TABLE: 0,
            SMALL: 1,
        }
        for name, shape in shapes.items():
            folder = save / table_folder(shape.table_id)
            first = next(p for p in sorted(folder.glob("part-*")) if p.stat().st_size > 20)
            with gzip.open(first, "rt") if first.suffix == ".gz" else open(first) as f:
                width = len(f.readline().split())
            assert width == saved_row_width(run.tables[name]) == shape.row_width, save.name
        assert (save / table_folder(2)).is_dir()  # the dense table


def test_the_servers_together_hold_the_keys_one_server_holds(run: Run) -> None:
    for moment, tables in run.keys_after.items():
        for name, keys in tables.items():
            assert len(keys["sharded"]) > 0
            np.testing.assert_array_equal(
                keys["sharded"], keys["one server"], err_msg=f"{moment}, {name}"
            )


def test_the_shrink_evicts_from_the_table_with_eviction_only(run: Run) -> None:
    before, after = run.keys_after["pass 4"], run.keys_after["shrink"]
    ids = DEFAULT_SPARSE_TABLE
    assert len(after[ids]["sharded"]) < 0.9 * len(before[ids]["sharded"])
    assert np.isin(after[ids]["sharded"], before[ids]["sharded"]).all()
    np.testing.assert_array_equal(after[SMALL]["sharded"], before[SMALL]["sharded"])


def test_a_delta_version_holds_exactly_the_keys_each_table_touched(run: Run) -> None:
    third = run.passes[2]
    manifest = run.versions[third]
    assert manifest.sparse.kind == "delta" and manifest.sparse.parent == run.passes[1]
    tables = load_sparse(artifact_dir(run.cfg, third), manifest)
    assert sorted(tables) == sorted(run.tables)
    for name, table in tables.items():
        touched = signs_of_pass(run.cfg, third, list(run.tables[name].slots))
        np.testing.assert_array_equal(np.sort(table.keys), touched, err_msg=name)
        assert table.dim == run.tables[name].dim == manifest.sparse_tables[name].dim
    keys = np.concatenate([t.keys for t in tables.values()])
    by_server = server_keys(Path(run.cfg.paths.checkpoint_root) / f"{third}-delta")
    assert all(np.intersect1d(keys, k).size for k in by_server.values())


def test_full_and_delta_versions_serve_the_clusters_own_scores(run: Run) -> None:
    kinds = {p: run.versions[p].sparse.kind for p in run.cluster_scores}
    assert list(kinds.values()) == ["full", "delta"]
    for pass_id, expected in run.cluster_scores.items():
        np.testing.assert_allclose(run.served_scores[pass_id], expected, rtol=0, atol=1e-5)
        np.testing.assert_allclose(run.redis_scores[pass_id], expected, rtol=0, atol=1e-5)


def test_a_restore_after_sigkill_gives_back_every_servers_keys_and_values(run: Run) -> None:
    """Pass 4, trained on the restored table, saves a base: the keys restored plus those
    pass 4 touched, and every key it did not touch with the value the chain saved."""
    fourth = run.passes[3]
    save = Path(run.cfg.paths.checkpoint_root) / f"{fourth}-base"
    info = CheckpointInfo.model_validate_json((save / "CHECKPOINT.json").read_text())
    for name, before in run.before_kill.items():
        base = read_table(save, info, run.tables[name])
        touched = signs_of_pass(run.cfg, fourth, list(run.tables[name].slots))
        np.testing.assert_array_equal(base.keys, np.union1d(before.keys, touched), err_msg=name)
        untouched = np.setdiff1d(before.keys, touched)
        if name == DEFAULT_SPARSE_TABLE:  # the small slots' few values recur in every pass
            assert len(untouched) > 100
        restored, _ = base.find(untouched)
        saved, _ = before.find(untouched)
        np.testing.assert_array_equal(base.values[restored], before.values[saved], err_msg=name)
