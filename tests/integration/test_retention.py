"""``streamrec retention`` on real passes (broker + builder) and a real redis-server: what
goes, what stays, and a dry run that deletes nothing. The passes are from January 2026,
older than every retention age; the Redis records and saves around them are written the
way the cluster and the registry write them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from killed_writer import killed_writer

from serving_export.delivery import registry_for
from streaming.join_spill import SpillStore
from streaming.slices import latest_slice
from streamrec.atomic_fs import temp_dir_for
from streamrec.config import DEFAULT_SPARSE_TABLE, dump_config
from streamrec.contracts.delivery import LayerSummary
from streamrec.contracts.pass_status import PassField, record
from streamrec.contracts.training import MaturedMetrics
from streamrec.layout import Layout
from streamrec.passes import complete_passes, pass_dir, slices_root
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import CheckpointInfo, write_info
from trainers.leftovers import run_listing

CLI = str(Path(sys.executable).with_name("streamrec"))
FIRST = "202601010000"
LATER = "202601020000"  # a window no pass of the test reaches


@pytest.fixture(scope="module")
def pipeline(
    make_config, build_passes, artifact_manifest, train_result
) -> Iterator[dict[str, Any]]:
    cfg = make_config(
        checkpoints={"keep_bases": 1},
        retention={"artifacts_keep": 1, "slices_days": 1, "passes_days": 7, "redis_days": 30},
        synthetic={"events_per_pass": 500},
    )
    build_passes(cfg, FIRST, 4)
    passes = complete_passes(cfg.paths.data_root)[:4]
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    for p in passes[:3]:  # trained, as the cluster records it; the fourth is not
        r.set(keys.done("train", p), f"cmd-{p}")
        record(r, keys, p, PassField.TRAIN, train_result(p))
        r.hset(keys.command(f"cmd-{p}"), mapping={"kind": "train", "pass_id": p})
    recent = cfg.passes.clock.id_of(datetime.now(UTC))
    record(r, keys, recent, PassField.TRAIN, train_result(recent))
    r.xadd(keys.commands, {"id": "old", "kind": "train", "pass_id": passes[0]}, id="1000-0")
    r.xadd(keys.commands, {"id": "new", "kind": "train", "pass_id": recent}, id="*")
    r.set(keys.cursor, "1000-0")  # the cluster has run the old command

    root = Path(cfg.paths.checkpoint_root)
    for seq, (p, kind) in enumerate(zip(passes[:3], ["base", "delta", "base"], strict=True)):
        parent = None if kind == "base" else f"{passes[seq - 1]}-base"
        info = CheckpointInfo(
            pass_id=p, kind=kind, seq=seq, parent=parent, table_keys=1, saved_keys=1
        )
        (root / info.name).mkdir(parents=True)
        write_info(root / info.name, info)
    for p in passes[:3]:
        (Path(cfg.paths.work_root) / "exports" / f"{p}-cmd").mkdir(parents=True)
    # score runs: an old pass's; a recent pass's progressive scores, judged on its final
    # labels, and the next one's, not judged yet
    layout = Layout.of(cfg.paths)
    waiting = cfg.passes.clock.next(recent)
    for folder in (
        layout.scores_dir(passes[0], "cmd"),
        *map(layout.progressive_scores, (recent, waiting)),
    ):
        folder.mkdir(parents=True)
    matured = MaturedMetrics(pass_id=recent, judged_in=waiting, tasks={})
    record(r, keys, recent, PassField.MATURED, matured)
    registry = registry_for(cfg)
    model_dir = Path(cfg.paths.model_root) / cfg.model.model
    parents = {passes[3]: passes[2]}  # the newest is a delta on the third: both are kept
    for p in passes:
        (model_dir / p).mkdir(parents=True)
        manifest = artifact_manifest(p, parent=parents.get(p))
        (model_dir / p / "MANIFEST.json").write_text(manifest.to_json())
        registry.register(manifest)
        sparse = LayerSummary(
            kind=manifest.sparse.kind, parent=manifest.sparse.parent, keys=1, tables={}
        )
        registry.promote(p)
        r.hset(keys.sparse_layers(cfg.model.model), p, sparse.to_json())  # Redis store
        r.hset(keys.sparse_layer(cfg.model.model, p, DEFAULT_SPARSE_TABLE), "k", "v")
    registry.rollback(passes[0])  # the oldest serves again: it must be kept
    config = dump_config(cfg, root.parent / "p.yaml")
    leftovers = {  # a crash's (its writer gone), a live writer's (this process), an old one
        "crashed": killed_writer(layout.data.pass_dir(LATER), "_manifest.json", "_SUCCESS"),
        # a spill store renamed away for removal, its remover killed before deleting it
        "spill": killed_writer(layout.join_spill(cfg.kafka.consumer_group, 3), "db"),
        "live": temp_dir_for(layout.export_dir(LATER, "cmd")),
        "old": layout.exports / f".{LATER}-old.tmp-0a1b2c3d",
    }
    leftovers["old"].mkdir()
    long_ago = time.time() - cfg.retention.leftover_minutes * 60 - 1
    os.utime(leftovers["old"], (long_ago, long_ago))
    # join spill stores, as the builder checkpoints them: partition 0's at its newest slice
    # (a builder taking it resumes there), partition 1's before it (the partition moved to
    # a builder that cut on), one never checkpointed, and one a live builder (this
    # process) holds open; another consumer group's is not this pipeline's to judge
    newest = latest_slice(cfg.paths.data_root, 0, cfg.passes.clock)
    assert newest is not None
    stores = {
        "resumable": (0, newest.pass_id),
        "moved": (1, passes[0]),
        "never": (7, None),
        "open": (8, None),
    }
    opened = []
    for name, (partition, closed_through) in stores.items():
        store = SpillStore(layout.join_spill(cfg.kafka.consumer_group, partition), 8)
        if name in ("resumable", "moved"):
            store.checkpoint(
                impressions={"e1": 1},
                labels={},
                duplicates=[],
                segments=[],
                unmatched={},
                meta={"closed_through": closed_through},
            )
        if name == "open":
            opened.append(store)
        else:
            store.close()
    SpillStore(layout.join_spill("another-group", 1), 8).close()
    yield {
        "cfg": cfg,
        "config": config,
        "passes": passes,
        "recent": recent,
        "leftovers": leftovers,
    }
    for store in opened:
        store.close()


def _retention(config: Path, *flags: str) -> dict[str, Any]:
    out = subprocess.run(
        [CLI, "retention", "--config", str(config), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _planned(result: dict[str, Any], kind: str) -> set[str]:
    return {Path(d["target"]).name for d in result["deletions"] if d["kind"] == kind}


def test_dry_run_lists_what_goes_and_deletes_nothing(pipeline: dict[str, Any]) -> None:
    cfg, passes = pipeline["cfg"], pipeline["passes"]
    before = sorted(
        p.relative_to(cfg.paths.data_root) for p in Path(cfg.paths.data_root).rglob("*")
    )
    result = _retention(pipeline["config"], "--dry-run")
    assert result["dry_run"] is True
    assert _planned(result, "pass") == set(passes[:3])  # the untrained fourth stays
    assert _planned(result, "slice") == set(passes[:3])  # the newest slice is a resume point
    assert _planned(result, "checkpoint") == {f"{passes[0]}-base", f"{passes[1]}-delta"}
    assert _planned(result, "raw-export") == {f"{p}-cmd" for p in passes[:2]}
    assert _planned(result, "score") == {f"{passes[0]}-cmd", f"{pipeline['recent']}-progressive"}
    # kept: the newest, the version it builds on, and the serving one
    assert _planned(result, "artifact") == {passes[1]}
    left = pipeline["leftovers"]
    assert _planned(result, "leftover") == {
        left["crashed"].name,
        left["old"].name,
        left["spill"].name,
    }
    assert _planned(result, "join-spill") == {"p1", "p7"}
    reasons = {Path(d["target"]).name: d["reason"] for d in result["deletions"]}
    assert f"checkpointed after the cut of {passes[0]}" in reasons["p1"]
    assert "no clean checkpoint" in reasons["p7"]
    redis_targets = {d["target"] for d in result["deletions"] if d["kind"] == "redis"}
    keys = RedisKeys(cfg.name)
    assert {keys.pass_status(p) for p in passes[:3]} <= redis_targets
    assert {keys.done("train", p) for p in passes[:3]} <= redis_targets
    assert any(" MINID " in t for t in redis_targets)
    after = sorted(p.relative_to(cfg.paths.data_root) for p in Path(cfg.paths.data_root).rglob("*"))
    assert after == before
    assert registry_for(cfg).versions() == sorted(passes)


def test_retention_deletes_what_it_listed_and_keeps_the_rest(pipeline: dict[str, Any]) -> None:
    cfg, passes = pipeline["cfg"], pipeline["passes"]
    planned = _retention(pipeline["config"], "--dry-run")["deletions"]
    result = _retention(pipeline["config"])
    assert result["dry_run"] is False and result["deletions"] == planned
    data = Path(cfg.paths.data_root)
    assert complete_passes(data) == passes[3:]
    assert pass_dir(data, passes[3]).is_dir()
    assert not (slices_root(data) / passes[0][:8] / passes[0]).exists()
    assert (slices_root(data) / passes[3][:8] / passes[3]).is_dir()
    assert [p.name for p in Path(cfg.paths.checkpoint_root).glob("2026*")] == [f"{passes[2]}-base"]
    assert run_listing(Path(cfg.paths.work_root) / "exports").names == (f"{passes[2]}-cmd",)
    waiting = cfg.passes.clock.next(pipeline["recent"])
    assert run_listing(Layout.of(cfg.paths).scores).names == (f"{waiting}-progressive",)
    registry = registry_for(cfg)
    assert registry.versions() == [passes[0], passes[2], passes[3]]
    assert registry.serving_version() == passes[0]
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    assert sorted(r.hkeys(keys.sparse_layers(cfg.model.model))) == registry.versions()
    assert not r.exists(keys.sparse_layer(cfg.model.model, passes[1], DEFAULT_SPARSE_TABLE))
    assert not any(r.exists(keys.done("train", p)) for p in passes[:3])
    assert r.exists(keys.pass_status(pipeline["recent"]))  # recent: kept
    assert [fields["id"] for _, fields in r.xrange(keys.commands)] == ["new"]
    left = pipeline["leftovers"]
    assert not left["crashed"].exists() and not left["old"].exists()
    assert not left["spill"].exists()
    assert left["live"].is_dir()  # its writer runs: it may still publish it
    spills = Layout.of(cfg.paths).join_spills(cfg.kafka.consumer_group)
    assert sorted(p.name for p in spills.iterdir()) == ["p0", "p8"]
    assert (spills.parent / "another-group" / "p1").is_dir()
    assert _retention(pipeline["config"])["deletions"] == []  # nothing left to delete
