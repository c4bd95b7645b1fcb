"""Checkpoint chains on disk: which save comes next, what to restore, what to delete.

Every save is a directory ``<checkpoint_root>/<pass_id>-<kind>`` holding what the servers
wrote plus ``CHECKPOINT.json`` (a ``CheckpointInfo``), published by one rename. Kinds:

    base   mode-0 save of every key (every ``base_every_passes`` passes)
    delta  mode-1 save of the keys touched since the previous save (every other pass)
    daily  the maintenance save after a logical day's last pass: mode 3 (every key, and +1
           to every key's unseen-days clock) right after a shrink; a base for restores

A chain is a base (or daily) followed by the deltas saved after it, each naming its parent.
Restoring loads the newest complete chain in order: a table load overwrites the keys it
reads and keeps the others, so base + deltas rebuild the table (dense tables are whole in
every save). Pure logic and file reading; the fleet calls live in ``saves``.
"""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from pydantic import BaseModel, ConfigDict, ValidationError

from streamrec.atomic_fs import write_text_atomic
from streamrec.contracts.training import CheckpointKind
from streamrec.listing import Listing, list_folder
from streamrec.passes import is_pass_keyed

log = logging.getLogger(__name__)

CHECKPOINT_MANIFEST = "CHECKPOINT.json"
SAVE_MODE: dict[str, int] = {"base": 0, "delta": 1, "daily": 3}


class SparseTableShape(BaseModel):
    """What decides a sparse table's saved rows: the pulled width and the SGD rule; and the
    folder of a save that holds it (its id on the servers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dim: int
    rule: str
    row_width: int  # columns of a saved line, the key included
    table_id: int = 0  # saves from before several tables held one, at id 0


class ModelSignature(BaseModel):
    """What a saved model must share with the model that loads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    network: str
    slots: dict[str, str]  # slot -> the slot its values are hashed as (the table's keys)
    sparse_tables: dict[str, SparseTableShape]
    dense: dict[str, tuple[int, ...]]  # dense parameter -> shape


class CheckpointInfo(BaseModel):
    """CHECKPOINT.json: what a save holds and where the stream stood."""

    pass_id: str  # the last pass trained into this state
    kind: CheckpointKind
    seq: int  # position in the cluster's history of saves; newest is highest
    parent: str | None  # the directory name of the save this one applies on top of
    day: str | None = None  # daily saves: the logical day (YYYYMMDD) they closed
    table_keys: int  # keys in the table after this save
    saved_keys: int  # keys written by this save
    consumed_to: dict[str, dict[str, int]] = {}
    resume_offsets: dict[str, dict[str, int]] = {}
    train: dict[str, Any] | None = None  # the pass's train result, for idempotent replies
    created_at: str = ""
    model: ModelSignature | None = None  # what wrote it (None: a save from before it was recorded)

    @property
    def name(self) -> str:
        return f"{self.pass_id}-{self.kind}"

    @property
    def mode(self) -> int:
        """The fleet save mode that wrote it."""
        return SAVE_MODE[self.kind]

    @property
    def is_base(self) -> bool:
        return self.kind != "delta"


def write_info(directory: Path, info: CheckpointInfo) -> None:
    """Write ``info`` into a save directory (before it is published)."""
    stamped = info.model_copy(update={"created_at": datetime.now(UTC).isoformat()})
    write_text_atomic(directory / CHECKPOINT_MANIFEST, stamped.model_dump_json(indent=2))


def checkpoint_listing(root: Path) -> Listing:
    """The save folders under ``root`` (``<pass_id>-<kind>``) and the writers' temporaries."""
    return list_folder(root, is_pass_keyed)


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Published saves under ``root``, oldest first (temporaries and strays are skipped)."""
    found = []
    root = Path(root)
    for name in checkpoint_listing(root).names:
        d = root / name
        manifest = d / CHECKPOINT_MANIFEST
        if not manifest.is_file():
            continue
        try:
            info = CheckpointInfo.model_validate_json(manifest.read_text())
        except (ValidationError, json.JSONDecodeError) as e:
            log.warning("ignoring checkpoint %s: unreadable %s (%s)", d, CHECKPOINT_MANIFEST, e)
            continue
        if info.name == d.name:
            found.append(info)
    return sorted(found, key=lambda i: i.seq)


def missing_tables(directory: Path, model: ModelSignature, servers: int | None = None) -> list[str]:
    """What a save lacks of its sparse tables: each table's folder with a
    ``part-<server>-<shard>`` file from every one of ``servers`` (None: from any). A save the
    servers failed is a folder without them: Paddle only logs the failure, and loading it
    kills the servers (SIGFPE in the dense table's load, seen in CI on 2026-11-29)."""
    missing = []
    for name, table in model.sparse_tables.items():
        folder = Path(directory) / f"{table.table_id:03d}"
        wrote = {part.name.split("-")[1] for part in folder.glob("part-*-*")}
        if servers is None:
            if not wrote:
                missing.append(f"{name} ({folder.name}/): no file")
        elif lost := [s for s in range(servers) if f"{s:03d}" not in wrote]:
            missing.append(f"{name} ({folder.name}/): nothing from server {lost}")
    return missing


def restore_chain(root: Path) -> list[CheckpointInfo]:
    """The saves to load in order: the newest save whose chain back to a base is complete
    (every save of it holding its sparse tables' files)."""
    by_name = {}
    for info in list_checkpoints(root):
        if info.model is not None and (lacks := missing_tables(Path(root) / info.name, info.model)):
            log.error("checkpoint %s is not loadable, passed over: %s", info.name, "; ".join(lacks))
            continue
        by_name[info.name] = info
    for newest in sorted(by_name.values(), key=lambda i: i.seq, reverse=True):
        chain = [newest]
        while not chain[-1].is_base:
            parent = by_name.get(chain[-1].parent or "")
            if parent is None:
                log.warning("checkpoint %s: parent %s is gone", newest.name, chain[-1].parent)
                break
            chain.append(parent)
        if chain[-1].is_base:
            return chain[::-1]
    return []


def next_kind(chain: list[CheckpointInfo], base_every_passes: int) -> CheckpointKind:
    """``base`` when the chain is empty or already holds ``base_every_passes`` passes."""
    return "base" if not chain or len(chain) >= base_every_passes else "delta"


def expired(root: Path, keep_bases: int) -> list[Path]:
    """Save directories older than the newest ``keep_bases`` bases (deltas included)."""
    saves = list_checkpoints(root)
    bases = [i for i in saves if i.is_base]
    if len(bases) <= keep_bases:
        return []
    oldest_kept = bases[-keep_bases].seq
    return [Path(root) / i.name for i in saves if i.seq < oldest_kept]


def apply_retention(root: Path, keep_bases: int) -> list[str]:
    """Delete expired saves; their names."""
    gone = []
    for path in expired(root, keep_bases):
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path.name)
    if gone:
        log.info("retention: deleted checkpoints %s", ", ".join(gone))
    return gone


def saved_column(
    directory: Path, column: int, dtype: pa.DataType, server: int | None = None
) -> np.ndarray:
    """One column of every key's line in every sparse table file of a save (with
    ``server``, only in the files that server wrote).

    The servers write one ``part-<server>-<shard>`` file per shard (gzip for full saves), a
    line per key: the key, then its values, space-separated (``strategy.saved_value_layout``
    names the columns)."""
    name = f"f{column}"
    values = [pa.array([], type=dtype).to_numpy()]
    for part in sorted(Path(directory).glob("*/part-*-*")):  # part-<server>-<shard>: sparse
        if server is not None and int(part.name.split("-")[1]) != server:
            continue
        if part.stat().st_size == 0:
            continue
        try:
            table = pacsv.read_csv(
                part,
                read_options=pacsv.ReadOptions(autogenerate_column_names=True),
                parse_options=pacsv.ParseOptions(delimiter=" "),
                convert_options=pacsv.ConvertOptions(
                    include_columns=[name], column_types={name: dtype}
                ),
            )
        except pa.ArrowInvalid as e:
            if "Empty CSV file" in str(e):  # an empty gzip: a shard with no keys
                continue
            raise
        values.append(table.column(name).to_numpy())
    return np.concatenate(values)


def saved_keys(directory: Path, server: int | None = None) -> np.ndarray:
    """The keys of every sparse table file in a save (sorted, unique, uint64); with
    ``server``, of that server's files only."""
    return np.unique(saved_column(directory, 0, pa.uint64(), server))
