"""Retention: what a pipeline left running for months may delete, and deleting it.

``plan`` lists every deletion with its reason and deletes nothing (the dry run); ``apply``
carries a plan out. What goes, by ``retention`` (and ``checkpoints.keep_bases``):

    pass        pass directories whose window ended before ``passes_days`` ago, once trained
    slice       slices of assembled passes older than ``slices_days``; never a window at or
                after any partition's newest slice (where the builder resumes)
    checkpoint  saves older than the newest ``keep_bases`` bases (the cluster also does this
                after every base)
    raw-export  the cluster's raw inference exports, all but the newest (artifacts hold them)
    score       the cluster's score runs of passes older than ``passes_days``, and a pass's
                progressive scores once it was judged on its final labels (fresh labels)
    artifact    model versions beyond the newest ``artifacts_keep``, never the serving one
                nor one a kept delta version builds on (directory, registry entry and the
                version's Redis embeddings)
    redis       pass status, done markers and command records of passes older than
                ``redis_days``; command stream entries older than that every worker has read
    leftover    a writer's temporary (slice, pass, save, export, score run, artifact) whose
                writer ran on this host and is gone, or unchanged for ``leftover_minutes``
    join-spill  this host's spill stores of the pipeline's consumer group that no builder
                has open and none could resume from: no clean checkpoint, or checkpointed
                before their partition's newest slice (the partition moved to another
                builder, which cut on); a store is kept while it is its partition's newest

Dead letters age out in the broker (``retention.ms`` of the dead-letter topics).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import redis

from serving_export.artifact import ancestors, artifact_dir, version_listing
from serving_export.delivery import registry_for
from serving_export.sparse_store import RedisStore
from streaming.join_spill import remove_if_stale, stale_reason
from streaming.slices import builder_leftovers, latest_slice, slice_partitions, slice_pass_ids
from streamrec.atomic_fs import leftover_reason, remove_path
from streamrec.config import PipelineConfig
from streamrec.contracts.pass_status import read_status
from streamrec.layout import PROGRESSIVE, Layout
from streamrec.listing import Listing, list_folder
from streamrec.passes import PassClock, complete_passes, is_day
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import expired, list_checkpoints
from trainers.leftovers import cluster_leftovers, run_listing

log = logging.getLogger(__name__)

Kind = Literal[
    "pass",
    "slice",
    "checkpoint",
    "raw-export",
    "score",
    "artifact",
    "redis",
    "leftover",
    "join-spill",
]


@dataclass(frozen=True)
class Deletion:
    """One thing retention removes: a directory or a Redis key (or stream range)."""

    kind: Kind
    target: str
    reason: str


@dataclass(frozen=True)
class RetentionResult:
    dry_run: bool
    deletions: list[Deletion]

    def counts(self) -> dict[str, int]:
        return dict(Counter(d.kind for d in self.deletions))

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "counts": self.counts(),
            "deletions": [asdict(d) for d in self.deletions],
        }


def _cutoff_id(clock: PassClock, now: datetime, days: float) -> str:
    return clock.id_of(now - timedelta(days=days))


def _trained(r: redis.Redis, keys: RedisKeys, pass_id: str, saved: set[str]) -> bool:
    return pass_id in saved or r.exists(keys.done("train", pass_id)) == 1


def _passes(cfg: PipelineConfig, r: redis.Redis, keys: RedisKeys, now: datetime):
    ret, clock = cfg.retention, cfg.passes.clock
    cutoff_ms = int((now - timedelta(days=ret.passes_days)).timestamp() * 1000)
    saved = {c.pass_id for c in list_checkpoints(cfg.paths.checkpoint_root)}
    for pass_id in complete_passes(cfg.paths.data_root):
        if clock.window(pass_id)[1] > cutoff_ms:
            break
        if _trained(r, keys, pass_id, saved):
            yield Deletion(
                "pass",
                str(Layout.of(cfg.paths).data.pass_dir(pass_id)),
                f"trained, window ended over {ret.passes_days:g} days ago",
            )


def _slices(cfg: PipelineConfig, now: datetime):
    root, clock = cfg.paths.data_root, cfg.passes.clock
    layout = Layout.of(cfg.paths)
    newest = [s.pass_id for p in slice_partitions(root) if (s := latest_slice(root, p, clock))]
    if not newest:
        return
    resume_from = min(newest)
    cutoff = _cutoff_id(clock, now, cfg.retention.slices_days)
    complete = set(complete_passes(root))
    for pass_id in sorted(slice_pass_ids(root)):
        if pass_id >= resume_from or pass_id >= cutoff:
            break
        if pass_id in complete:
            yield Deletion(
                "slice",
                str(layout.data.slices_of(pass_id)),
                f"assembled into its pass, older than {cfg.retention.slices_days:g} days",
            )


def _checkpoints(cfg: PipelineConfig):
    for path in expired(cfg.paths.checkpoint_root, cfg.checkpoints.keep_bases):
        yield Deletion(
            "checkpoint", str(path), f"older than the newest {cfg.checkpoints.keep_bases} bases"
        )


def _raw_exports(cfg: PipelineConfig):
    root = Layout.of(cfg.paths).exports
    for name in run_listing(root).names[:-1]:
        yield Deletion("raw-export", str(root / name), "packaged or superseded by a newer export")


def _scores(cfg: PipelineConfig, r: redis.Redis, keys: RedisKeys, now: datetime):
    root, days = Layout.of(cfg.paths).scores, cfg.retention.passes_days
    cutoff = _cutoff_id(cfg.passes.clock, now, days)
    for name in run_listing(root).names:
        pass_id, _, run = name.partition("-")
        if pass_id < cutoff:
            yield Deletion("score", str(root / name), f"its pass is older than {days:g} days")
        elif run == PROGRESSIVE and read_status(r, keys, pass_id).matured is not None:
            yield Deletion("score", str(root / name), "its pass was judged on its final labels")


def _artifacts(cfg: PipelineConfig):
    registry = registry_for(cfg)
    serving = registry.serving_version()
    model_dir = Layout.of(cfg.paths).model_dir(cfg.model.model)
    on_disk = set(version_listing(model_dir).names)
    versions = sorted(on_disk | set(registry.versions()))
    keep = set(versions[-cfg.retention.artifacts_keep :]) | ({serving} if serving else set())
    keep |= {a for version in keep for a in ancestors(model_dir, version)}
    for version in versions:
        if version not in keep:
            yield Deletion(
                "artifact",
                str(artifact_dir(cfg, version)),
                f"older than the newest {cfg.retention.artifacts_keep} versions, not serving, "
                "no kept version builds on it",
            )


def _redis_keys(cfg: PipelineConfig, r: redis.Redis, keys: RedisKeys, now: datetime):
    cutoff = _cutoff_id(cfg.passes.clock, now, cfg.retention.redis_days)
    why = f"pass older than {cfg.retention.redis_days:g} days"
    for pattern in (keys.pass_status("*"), keys.done("*", "*")):
        for key in scan_keys(r, pattern):
            if keys.pass_of(key) < cutoff:
                yield Deletion("redis", key, why)
    for key in scan_keys(r, keys.command("*")):
        pass_id = r.hget(key, "pass_id")
        if pass_id and pass_id < cutoff:
            yield Deletion("redis", key, why)
    # Stream ids are <ms>-<seq>: trim by age, but never past a command the cluster has not run.
    oldest_kept = (int((now - timedelta(days=cfg.retention.redis_days)).timestamp() * 1000), 0)
    cursor = r.get(keys.cursor)
    if cursor is not None:
        ms, seq = (int(part) for part in cursor.split("-"))
        oldest_kept = min(oldest_kept, (ms, seq + 1))
    min_id = f"{oldest_kept[0]}-{oldest_kept[1]}"
    if r.xrange(keys.commands, max=f"({min_id}", count=1):
        yield Deletion("redis", f"{keys.commands} MINID {min_id}", "commands every worker read")


def leftovers(cfg: PipelineConfig) -> list[Path]:
    """Every writer's temporary in the pipeline's folders (live or left by a crash): the
    pass builder's (a spill store a crash left half removed too), the cluster's and
    delivery's."""
    model_dir = Layout.of(cfg.paths).model_dir(cfg.model.model)
    return [
        *builder_leftovers(cfg.paths.data_root).leftovers,
        *cluster_leftovers(cfg.paths).leftovers,
        *version_listing(model_dir).leftovers,
        *_spill_listing(cfg).leftovers,
    ]


def _leftovers(cfg: PipelineConfig, now: datetime):
    grace_s = cfg.retention.leftover_minutes * 60
    for path in leftovers(cfg):
        try:
            why = leftover_reason(path, grace_s, now.timestamp())
        except FileNotFoundError:  # published or removed while we looked
            continue
        if why is not None:
            yield Deletion("leftover", str(path), f"a writer's temporary: {why}")


def _spill_listing(cfg: PipelineConfig) -> Listing:
    """This host's spill stores of the pipeline's consumer group (``p<N>``), and the
    leftovers of stores a crash left half removed."""
    folder = Layout.of(cfg.paths).join_spills(cfg.kafka.consumer_group)
    return list_folder(folder, lambda name: name[:1] == "p" and name[1:].isdigit())


def _spill_stores(cfg: PipelineConfig) -> dict[Path, str | None]:
    """This host's spill stores of the pipeline's consumer group, each with its
    partition's newest slice."""
    folder = Layout.of(cfg.paths).join_spills(cfg.kafka.consumer_group)
    stores = {}
    for name in _spill_listing(cfg).names:
        newest = latest_slice(cfg.paths.data_root, int(name[1:]), cfg.passes.clock)
        stores[folder / name] = newest.pass_id if newest else None
    return stores


def _join_spills(cfg: PipelineConfig):
    for path, newest in _spill_stores(cfg).items():
        if (why := stale_reason(path, newest)) is not None:
            yield Deletion("join-spill", str(path), f"a stale spill store: {why}")


def plan(cfg: PipelineConfig, now: datetime | None = None) -> list[Deletion]:
    """Everything retention would delete now, with the reason; deletes nothing."""
    now = now or datetime.now(UTC)
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    return [
        *_passes(cfg, r, keys, now),
        *_slices(cfg, now),
        *_checkpoints(cfg),
        *_raw_exports(cfg),
        *_scores(cfg, r, keys, now),
        *_artifacts(cfg),
        *_redis_keys(cfg, r, keys, now),
        *_leftovers(cfg, now),
        *_join_spills(cfg),
    ]


def apply(
    cfg: PipelineConfig, dry_run: bool = False, now: datetime | None = None
) -> RetentionResult:
    """Delete what ``plan`` lists (nothing with ``dry_run``)."""
    deletions = plan(cfg, now)
    if dry_run:
        return RetentionResult(True, deletions)
    r = connect(cfg.redis)
    registry = registry_for(cfg)
    layers = RedisStore.from_config(
        cfg.redis, RedisKeys(cfg.name), cfg.model.model, Path(cfg.paths.model_root)
    )
    spills = _spill_stores(cfg) if any(d.kind == "join-spill" for d in deletions) else {}
    for d in deletions:
        if d.kind == "redis" and " MINID " in d.target:
            stream, _, min_id = d.target.split(" ")
            r.xtrim(stream, minid=min_id, approximate=False)
        elif d.kind == "redis":
            r.delete(d.target)
        elif d.kind == "join-spill":  # judged again under the store's lock
            remove_if_stale(Path(d.target), spills.get(Path(d.target)))
        else:
            if d.kind == "artifact":
                registry.forget(Path(d.target).name)
                layers.drop(Path(d.target).name)
            remove_path(Path(d.target))
    _remove_empty_days(cfg)
    if deletions:
        log.info("retention deleted %s", json.dumps(RetentionResult(False, deletions).counts()))
    return RetentionResult(False, deletions)


def _remove_empty_days(cfg: PipelineConfig) -> None:
    data = Layout.of(cfg.paths).data
    for root in (data.passes, data.slices):
        for day in list_folder(root, is_day).names:
            if not any((root / day).iterdir()):
                (root / day).rmdir()
