"""Admission, daily maintenance and eviction of sparse keys on a real cluster.

Three logical days of a stream with a heavy tail of one-off user ids (two 12-hour passes a
day). After each day's last pass the cluster shrinks the table and saves it in mode 3, once
per day even across a restart. With eviction on, the table stays bounded; with admission
on, most one-off keys never enter it; mode-3 saves age the keys nobody sees. The version
published after each day's shrink is full: the keys it deleted leave serving too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ops import pass_sequence
from serving_export import delivery
from serving_export.manifest import ArtifactManifest
from serving_export.sparse_store import InProcessStore
from streamrec.config import DEFAULT_SPARSE_TABLE, PipelineConfig, dump_config
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.training import MaintainReply
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import list_checkpoints, saved_column
from trainers.launcher import LocalCluster
from trainers.worker.strategy import UNSEEN_DAYS_COLUMN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FIRST = "202610010000"
PASS_SECONDS = 43_200  # two passes a day: maintenance after every second pass


@dataclass
class Lifecycle:
    cfg: PipelineConfig
    keys_after_pass: list[int]
    maintenance: list[MaintainReply]  # the three days' replies
    versions: list[ArtifactManifest]  # with ``publish``: each pass's, as the DAG makes it


@pytest.fixture(scope="module")
def stream(make_config, build_passes) -> tuple[PipelineConfig, list[str]]:
    cfg = make_config(
        join={"mode": "label_in_impression"},
        passes={"pass_seconds": PASS_SECONDS},
        synthetic={"events_per_pass": 3000, "cardinality": {"user_id": 2_000_000}},
    )
    return cfg, list(build_passes(cfg, FIRST, 6))[:6]


def _kept(day: MaintainReply) -> int:
    """The keys a day's maintenance kept (its daily save's)."""
    assert day.checkpoint is not None, day
    return day.checkpoint.table_keys


def _run(
    make_config, stream_cfg: PipelineConfig, passes: list[str], publish: bool = False, **table
) -> Lifecycle:
    cfg = make_config(
        join={"mode": "label_in_impression"},
        passes={"pass_seconds": PASS_SECONDS},
        model={"hyper_parameters": {"sparse_table": table}},
        paths={"data_root": stream_cfg.paths.data_root},
    )
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    keys, maintenance, versions = [], [], []
    with LocalCluster(cfg, resolved) as cluster:
        for pass_id in passes:
            trained = cluster.client.train(pass_id)
            keys.append(trained.checkpoint.table_keys)
            if publish:  # before the day's end, as the DAG's tasks run (any gate passes)
                passed = GateDecision(passed=True, auc=trained.test.auc, serving_auc=None)
                version = pass_sequence.export_and_publish(cfg, cluster.client, pass_id, passed)
                versions.append(delivery.registry_for(cfg).manifest(version))
            # the cluster's half of pass_sequence.day_end: retention would delete the
            # passes of the stream the other fixture's cluster trains on
            if cfg.passes.clock.closes_day(pass_id):
                maintenance.append(cluster.client.maintain(pass_id))
    return Lifecycle(cfg, keys, maintenance, versions)


@pytest.fixture(scope="module")
def plain(stream, make_config) -> Lifecycle:
    """Defaults: no eviction, no admission."""
    stream_cfg, passes = stream
    return _run(make_config, stream_cfg, passes)


def _unseen_days(save: Path) -> np.ndarray:
    """The unseen-days value of every key in a save."""
    return saved_column(save, UNSEEN_DAYS_COLUMN, pa.float64())


def test_maintenance_runs_once_a_day_and_ages_unseen_keys(stream, plain: Lifecycle) -> None:
    _, passes = stream
    assert [m.day for m in plain.maintenance] == ["20261001", "20261002", "20261003"]
    assert plain.keys_after_pass == sorted(plain.keys_after_pass)  # nothing is ever evicted
    saves = {i.name: i for i in list_checkpoints(plain.cfg.paths.checkpoint_root)}
    for day_last, next_pass in ((passes[1], passes[2]), (passes[3], passes[4])):
        assert saves[f"{day_last}-daily"].kind == "daily"
        assert saves[f"{next_pass}-delta"].parent == f"{day_last}-daily"  # the new base
    # mode 3 is the only clock: a key last seen on day 1 has been through two daily saves
    root = Path(plain.cfg.paths.checkpoint_root)
    assert _unseen_days(root / f"{passes[1]}-daily").max() == 0
    assert _unseen_days(root / f"{passes[5]}-daily").max() == 2

    # once per logical day, across a restart and a lost done marker
    resolved = dump_config(plain.cfg, Path(plain.cfg.paths.work_root) / "again.yaml")
    with LocalCluster(plain.cfg, resolved) as cluster:
        connect(plain.cfg.redis).delete(RedisKeys(plain.cfg.name).done("maintain", passes[3]))
        again = cluster.client.maintain(passes[3])
    assert again.already_done and again.maintenance
    assert len([i for i in list_checkpoints(root) if i.kind == "daily"]) == 3


def test_eviction_bounds_the_table_and_admission_keeps_one_off_keys_out(
    stream, make_config, plain: Lifecycle
) -> None:
    stream_cfg, passes = stream
    evicting = _run(
        make_config,
        stream_cfg,
        passes,
        publish=True,
        delete_threshold=0.25,
        delete_after_unseen_days=1,
    )
    admitting = _run(make_config, stream_cfg, passes, admission=True)

    after_shrink = [_kept(m) for m in evicting.maintenance]
    plain_days = [_kept(m) for m in plain.maintenance]
    print(
        "table keys per pass: plain", plain.keys_after_pass, "after each day", plain_days,
        "| evicting", evicting.keys_after_pass, "after each shrink", after_shrink,
        "| admitting", admitting.keys_after_pass,
    )  # fmt: skip
    for day in evicting.maintenance:  # every shrink removes the keys below the threshold
        assert day.keys_before is not None and _kept(day) < day.keys_before
    assert after_shrink[-1] < 0.5 * plain_days[-1]
    # bounded: once keys can age out (unseen for more than one day), the table stops
    # growing with the stream while the plain one keeps taking every new one-off id
    assert after_shrink[2] <= 1.2 * after_shrink[1], after_shrink
    assert after_shrink[2] - after_shrink[1] < 0.5 * (plain_days[2] - plain_days[1])
    # a new key shown once enters with probability nonclk_coeff (0.1) under admission
    assert admitting.keys_after_pass[0] < 0.6 * plain.keys_after_pass[0]

    # serving: a day's last pass is exported before its shrink and daily save, so the next
    # version is full and the keys the shrink deleted leave the table a consumer holds, even
    # one that had applied the deltas before it
    versions = evicting.versions
    kinds = [v.sparse.kind for v in versions]
    assert kinds == ["full", "delta", "full", "delta", "full", "delta"], kinds
    store = InProcessStore(Path(evicting.cfg.paths.model_root) / evicting.cfg.model.model)
    for before, daily in ((versions[1], versions[2]), (versions[3], versions[4])):
        held = store.embeddings_for(before.version).tables[DEFAULT_SPARSE_TABLE]
        held_keys = np.union1d(held.base.keys, held.overlay.keys)
        after = store.embeddings_for(daily.version).tables[DEFAULT_SPARSE_TABLE]
        deleted = np.setdiff1d(held_keys, np.union1d(after.base.keys, after.overlay.keys))
        assert len(deleted) > 0
        assert not after.lookup(deleted).any()
        assert held.lookup(deleted).any()
