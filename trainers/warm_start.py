"""A fresh cluster started from a model trained elsewhere (``checkpoints.warm_start``,
``streamrec cluster --warm-start PATH``) instead of from random.

The source is another pipeline's checkpoint root (its newest complete chain), one of its
saves (with the saves it builds on), or a directory Paddle's parameter server saved itself
(``fleet.save_persistables``, PaddleRec's save): the same layout without CHECKPOINT.json.
Every streamrec save records the ``ModelSignature`` of the model that wrote it: the
network, the slots whose keys the table holds, each sparse table's width and rule, the
dense parameters with their shapes. Before anything starts, the configured model's
signature is compared with the source's and every difference is named (exit 2); a Paddle
directory has no signature, so the width of its sparse rows and the count of its dense
values are compared instead. Once this pipeline has a checkpoint of its own, it restores
that and the warm start is ignored.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from streamrec.config import PipelineConfig, sparse_tables
from streamrec.errors import ConfigError
from trainers.checkpoints import (
    CHECKPOINT_MANIFEST,
    CheckpointInfo,
    ModelSignature,
    SparseTableShape,
    list_checkpoints,
    restore_chain,
)
from trainers.network_loader import network_path
from trainers.worker.strategy import saved_row_width, sparse_table_ids, table_folder

KEY = "checkpoints.warm_start"


def model_signature(cfg: PipelineConfig, program: Any) -> ModelSignature:
    """The signature of the model ``program`` (built from ``cfg``, distributed) trains."""
    tables = sparse_tables(cfg.feature_schema, cfg.model)
    ids = sparse_table_ids(program)
    return ModelSignature(
        network=network_path(cfg.model),
        slots={s.name: s.key_slot for s in cfg.feature_schema.sparse},
        sparse_tables={
            name: SparseTableShape(
                dim=t.dim,
                rule=t.config.rule,
                row_width=saved_row_width(t),
                table_id=ids[name],
            )
            for name, t in tables.items()
        },
        dense={
            p.name: tuple(int(d) for d in p.shape)
            for p in program.all_parameters()
            if p.name not in tables
        },
    )


def differences(saved: ModelSignature, ours: ModelSignature) -> list[str]:
    """What differs between a saved model and the configured one, in words (none: [])."""
    found = []
    for what, a, b in (
        ("slot", saved.slots, ours.slots),
        ("sparse table", saved.sparse_tables, ours.sparse_tables),
        ("dense parameter", saved.dense, ours.dense),
    ):
        for name in sorted(set(a) | set(b)):
            if name not in b:
                found.append(f"{what} {name} is in the saved model only")
            elif name not in a:
                found.append(f"{what} {name} is not in the saved model")
            elif a[name] != b[name]:
                found.append(
                    f"{what} {name}: saved {_shown(a[name])}, configured {_shown(b[name])}"
                )
    if found and saved.network != ours.network:
        found.insert(0, f"network: saved {saved.network}, configured {ours.network}")
    return found


def _shown(value: Any) -> str:
    if isinstance(value, BaseModel):
        return ", ".join(f"{k} {v}" for k, v in value.model_dump().items())
    return str(list(value)) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class WarmStart:
    """The saves to load, oldest first, and the signature they record (None: Paddle's)."""

    saves: tuple[Path, ...]
    signature: ModelSignature | None


def _chain_to(save: Path, info: CheckpointInfo) -> tuple[Path, ...]:
    by_name = {i.name: i for i in list_checkpoints(save.parent)}
    chain = [info]
    while not chain[-1].is_base:
        parent = by_name.get(chain[-1].parent or "")
        if parent is None:
            raise ConfigError(
                f"{KEY}: {save} is a delta whose parent {chain[-1].parent} is gone from "
                f"{save.parent}: name a base save or the checkpoint root"
            )
        chain.append(parent)
    return tuple(save.parent / i.name for i in reversed(chain))


def warm_start_source(path: Path) -> WarmStart:
    """The saves ``path`` names; ConfigError naming the key when it holds none."""
    path = Path(path)
    manifest = path / CHECKPOINT_MANIFEST
    if manifest.is_file():
        info = CheckpointInfo.model_validate_json(manifest.read_text())
        return WarmStart(_chain_to(path, info), info.model)
    chain = restore_chain(path)
    if chain:
        return WarmStart(tuple(path / i.name for i in chain), chain[-1].model)
    if (path / table_folder(0)).is_dir() and (path / table_folder(1)).is_dir():
        return WarmStart((path,), None)
    raise ConfigError(
        f"{KEY}: {path} holds no model: name another pipeline's checkpoint root, one of "
        "its saves, or a directory fleet.save_persistables wrote"
    )


def _first_line(table_dir: Path) -> str | None:
    for part in sorted(table_dir.glob("part-*")):
        with gzip.open(part, "rt") if part.suffix == ".gz" else open(part) as f:
            line = f.readline().strip()
            if line:
                return line
    return None


def _dense_values(table_dir: Path) -> int:
    count = 0
    for part in sorted(table_dir.glob("part-*")):
        with gzip.open(part, "rt") if part.suffix == ".gz" else open(part) as f:
            count += sum(1 for line in f if line.strip())
    return count


def _paddle_differences(save: Path, ours: ModelSignature) -> list[str]:
    """A Paddle directory against the configured model: each sparse table's row width and
    the dense values (the dense table follows the sparse ones)."""
    found = []
    for name, expected in ours.sparse_tables.items():
        folder = table_folder(expected.table_id)
        line = _first_line(save / folder)
        if line is not None and len(line.split()) != expected.row_width:
            found.append(
                f"sparse table {name} (folder {folder}): rows have {len(line.split())} "
                f"columns, this model's {expected.row_width} (dim {expected.dim}, rule "
                f"{expected.rule})"
            )
    dense = sum(_size(shape) for shape in ours.dense.values())
    saved = _dense_values(save / table_folder(len(ours.sparse_tables)))
    if saved != dense:
        found.append(f"{saved} dense values saved, this network has {dense}")
    return found


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_warm_start(cfg: PipelineConfig, ours: ModelSignature) -> WarmStart | None:
    """The warm start to load, checked against the configured model; None when there is
    none or this pipeline restores its own checkpoints. ConfigError naming what differs."""
    path = cfg.checkpoints.warm_start
    if path is None or restore_chain(Path(cfg.paths.checkpoint_root)):
        return None
    source = warm_start_source(path)
    if source.signature is not None:
        found = differences(source.signature, ours)
    else:
        found = _paddle_differences(source.saves[-1], ours)
    if found:
        raise ConfigError(f"{KEY}: {path} does not fit the configured model: " + "; ".join(found))
    return source
