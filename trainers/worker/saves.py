"""Checkpoints from the worker's side: the save after a pass (a delta, or a base every N),
the daily shrink and save, the restore at start, and whether a command's effect is already
in the restored model. Paddle's saves run on worker 0 between barriers; every worker calls
each step. The pure chain logic is ``trainers.checkpoints``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.atomic_fs import publish_dir, temp_path_for
from streamrec.contracts.training import MaintainReply, SaveSummary
from streamrec.layout import day_of
from streamrec.passes import PassManifest, pass_dir, read_manifest
from trainers.checkpoints import (
    CheckpointInfo,
    CheckpointKind,
    apply_retention,
    list_checkpoints,
    missing_tables,
    restore_chain,
    saved_keys,
    write_info,
)
from trainers.errors import SaveFailed
from trainers.warm_start import check_warm_start
from trainers.worker import dense_tables
from trainers.worker.worker_context import WorkerContext, agree_any

log = logging.getLogger(__name__)


def checkpoint_summary(ctx: WorkerContext, info: CheckpointInfo) -> SaveSummary:
    """What a command's reply says of a save."""
    return SaveSummary(
        name=info.name,
        kind=info.kind,
        path=str(Path(ctx.cfg.paths.checkpoint_root) / info.name),
        table_keys=info.table_keys,
        saved_keys=info.saved_keys,
    )


def save(
    ctx: WorkerContext,
    pass_id: str,
    kind: CheckpointKind,
    manifest: PassManifest,
    train: dict[str, Any] | None,
) -> CheckpointInfo:
    """Save the servers' tables as ``kind`` after ``pass_id``: every worker calls the save
    (it runs on worker 0 between barriers); worker 0 writes CHECKPOINT.json into the
    temporary directory, renames it into place and applies retention; a barrier later every
    worker adopts the same chain. A save the servers did not write (no table files: Paddle
    only logs the failure) is made once more as a base, a full save, since a delta after a
    failed one could miss keys it marked saved; a daily save is not (its mode ages every
    key), it fails the command and the previous save stands."""
    try:
        return _save_as(ctx, pass_id, kind, manifest, train)
    except SaveFailed as e:
        if kind == "daily":
            raise
        log.error("%s: saving once more, as a base", e)
        return _save_as(ctx, pass_id, "base", manifest, train)


def _save_as(
    ctx: WorkerContext,
    pass_id: str,
    kind: CheckpointKind,
    manifest: PassManifest,
    train: dict[str, Any] | None,
) -> CheckpointInfo:
    from paddle.distributed import fleet

    root = Path(ctx.cfg.paths.checkpoint_root)
    root.mkdir(parents=True, exist_ok=True)
    parent = ctx.chain[-1] if ctx.chain else None
    info = CheckpointInfo(
        pass_id=pass_id,
        kind=kind,
        seq=parent.seq + 1 if parent else 0,
        parent=parent.name if parent and kind == "delta" else None,
        day=day_of(pass_id) if kind == "daily" else None,
        table_keys=0,
        saved_keys=0,
        consumed_to=manifest.consumed_to,
        resume_offsets=manifest.resume_offsets,
        train=train,
        model=ctx.signature,
    )
    final = root / info.name
    tmp = temp_path_for(final)  # Paddle writes it; only worker 0's name is used (on CPU)
    settled = ctx.leader_only(dense_tables.settle)
    if settled is not None:
        log.info("dense tables settled %.3f s after the pass", settled)
    fleet.save_persistables(ctx.exe, str(tmp), mode=info.mode)
    lacks = ctx.leader_only(lambda: missing_tables(tmp, ctx.signature, fleet.server_num()))
    if agree_any(bool(lacks)):  # every worker raises alike: they retry together
        ctx.leader_only(lambda: shutil.rmtree(tmp, ignore_errors=True))
        raise SaveFailed(
            f"the servers' save of {info.name} wrote no tables "
            f"({'; '.join(lacks or []) or 'worker 0 has the list'}): see the server logs"
        )

    def publish() -> CheckpointInfo:
        keys = saved_keys(tmp)
        ctx.table_keys = keys if info.is_base else np.union1d(ctx.table_keys, keys)
        counted = info.model_copy(
            update={"table_keys": len(ctx.table_keys), "saved_keys": len(keys)}
        )
        write_info(tmp, counted)
        stale = temp_path_for(final)
        if final.exists():  # left by a lineage the restored model does not descend from
            final.rename(stale)
        publish_dir(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
        if info.is_base:
            apply_retention(root, ctx.cfg.checkpoints.keep_bases)
        return counted

    info = ctx.leader_only(publish) or info
    ctx.chain = [info] if info.is_base else [*ctx.chain, info]
    log.info("checkpoint %s saved (%d keys in the table)", info.name, info.table_keys)
    return info


def maintain(ctx: WorkerContext, pass_id: str, command_id: str) -> MaintainReply:
    """The daily sequence after the last pass of a logical day: shrink (decay show/click,
    delete keys below ``delete_threshold`` or unseen too long), then a mode-3 save (every
    key; +1 to every key's unseen-days clock), which becomes the new base."""
    from paddle.distributed import fleet

    if not ctx.chain or ctx.chain[-1].pass_id != pass_id:
        raise ValueError(
            f"maintenance after {pass_id} asked, but the model's newest pass is "
            f"{ctx.chain[-1].pass_id if ctx.chain else 'none'}: train {pass_id} first"
        )
    keys_before = ctx.chain[-1].table_keys
    seconds: dict[str, float] = {}
    with ctx.stage("shrink", seconds, blocking=True):
        fleet.shrink()
    manifest = read_manifest(pass_dir(ctx.cfg.paths.data_root, pass_id))
    with ctx.stage("save", seconds, blocking=True):
        info = save(ctx, pass_id, "daily", manifest, ctx.chain[-1].train)
    return MaintainReply(
        pass_id=pass_id,
        day=day_of(pass_id),
        keys_before=keys_before,
        checkpoint=checkpoint_summary(ctx, info),
        seconds=seconds,
    )


def restore(ctx: WorkerContext) -> CheckpointInfo | None:
    """Load the newest complete chain (base, then its deltas in order) into the servers.
    Every worker calls it at start; an empty checkpoint root starts a fresh model, from
    ``checkpoints.warm_start`` when it names one (checked at the command's start)."""
    from paddle.distributed import fleet

    root = Path(ctx.cfg.paths.checkpoint_root)
    chain = restore_chain(root)
    saves = [root / info.name for info in chain]
    warm = None if chain else check_warm_start(ctx.cfg, ctx.signature)
    if warm is not None:
        saves = list(warm.saves)
        log.info("warm start from %s (%d saves)", ctx.cfg.checkpoints.warm_start, len(saves))
    for directory in saves:
        fleet.load_model(str(directory), mode=0)

    def count_keys() -> None:
        for i, directory in enumerate(saves):
            keys = saved_keys(directory)
            ctx.table_keys = keys if i == 0 else np.union1d(ctx.table_keys, keys)

    ctx.leader_only(count_keys)
    ctx.chain = chain
    if chain:
        log.info(
            "restored %s (%d saves, %d keys): the model has trained through pass %s",
            chain[-1].name,
            len(chain),
            chain[-1].table_keys,
            chain[-1].pass_id,
        )
    return chain[-1] if chain else None


def done_in_model(ctx: WorkerContext, kind: str, pass_id: str) -> dict[str, Any] | None:
    """The stored result if the restored model already holds this command's effect: a
    pass at or before the newest save's pass, or a day whose daily save exists."""
    if not ctx.chain:
        return None
    newest = ctx.chain[-1]
    if kind == "train" and pass_id <= newest.pass_id:
        return {**(newest.train or {}), "pass_id": pass_id, "already_in_model": newest.name}
    if kind == "maintain" and any(
        i.kind == "daily" and i.pass_id >= pass_id
        for i in list_checkpoints(Path(ctx.cfg.paths.checkpoint_root))
    ):
        return {"pass_id": pass_id, "already_in_model": newest.name}
    return None
