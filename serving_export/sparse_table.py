"""Sparse embeddings as sorted arrays: read from the servers' saves, merged, looked up.

Servers write each table of a save to its own folder (its id), each shard as text (gzip for
full saves), one key per line, space-separated: the key, the accessor's counters, then the
embedding and its optimizer state. The export spec's ``saved_value_layout`` of a table
says which columns hold ``embed_w`` and ``embedx_w``; the pulled embedding (what training
looked up) is ``[embed_w, embedx_w...]``. Parsing is columnar (pyarrow's CSV reader), not a
Python loop per line. ``newest_wins`` merges saves or versions in order;
``LayeredEmbeddings`` is what serving reads of a table: a full table plus the keys changed
since, compacted off the request path; ``LayeredTables`` holds one per table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from serving_export.errors import ExportInvalid


@dataclass(frozen=True)
class SparseEmbeddings:
    """Sorted feature signs and their embeddings (row i belongs to keys[i])."""

    keys: np.ndarray  # uint64, sorted ascending
    values: np.ndarray  # float32 [n, dim]

    @property
    def dim(self) -> int:
        return self.values.shape[1]

    def find(self, signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row of each sign and whether the table holds it."""
        signs = np.asarray(signs, dtype=np.uint64)
        if len(self.keys) == 0:
            return np.zeros(len(signs), dtype=np.intp), np.zeros(len(signs), dtype=bool)
        idx = np.minimum(np.searchsorted(self.keys, signs), len(self.keys) - 1)
        return idx, self.keys[idx] == signs

    def lookup(self, signs: np.ndarray) -> np.ndarray:
        """Embeddings of ``signs``; zeros for keys the table never saw (cold start)."""
        idx, hit = self.find(signs)
        out = np.zeros((len(hit), self.dim), dtype=np.float32)
        out[hit] = self.values[idx[hit]]
        return out


def empty_embeddings(dim: int) -> SparseEmbeddings:
    return SparseEmbeddings(np.zeros(0, np.uint64), np.zeros((0, dim), np.float32))


def newest_wins(tables: list[SparseEmbeddings]) -> SparseEmbeddings:
    """One sorted table from ``tables`` given oldest first: a key takes its newest value."""
    if len(tables) == 1:
        return tables[0]
    keys = np.concatenate([t.keys for t in tables])
    values = np.concatenate([t.values for t in tables])
    order = np.argsort(keys, kind="stable")  # equal keys stay oldest first
    keys, values = keys[order], values[order]
    last = np.append(keys[1:] != keys[:-1], True) if len(keys) else np.zeros(0, bool)
    return SparseEmbeddings(keys[last], values[last])


@dataclass(frozen=True)
class LayeredEmbeddings:
    """A full table and the keys changed since (newer values win), immutable: applying a
    delta builds a new instance off the request path, costing the size of the overlay, and
    folds the overlay into the base once it outgrows ``compact_ratio`` of it."""

    base: SparseEmbeddings
    overlay: SparseEmbeddings
    compact_ratio: float = 0.25

    @classmethod
    def of(cls, table: SparseEmbeddings, compact_ratio: float = 0.25) -> LayeredEmbeddings:
        return cls(table, empty_embeddings(table.dim), compact_ratio)

    @property
    def dim(self) -> int:
        return self.base.dim

    def __len__(self) -> int:
        return (
            len(self.base.keys)
            + len(self.overlay.keys)
            - int(self.base.find(self.overlay.keys)[1].sum())
        )

    def lookup(self, signs: np.ndarray) -> np.ndarray:
        out = self.base.lookup(signs)
        if len(self.overlay.keys):
            idx, hit = self.overlay.find(signs)
            out[hit] = self.overlay.values[idx[hit]]
        return out

    def apply(self, delta: SparseEmbeddings) -> LayeredEmbeddings:
        overlay = newest_wins([self.overlay, delta])
        if len(overlay.keys) > self.compact_ratio * max(len(self.base.keys), 1):
            return LayeredEmbeddings.of(newest_wins([self.base, overlay]), self.compact_ratio)
        return LayeredEmbeddings(self.base, overlay, self.compact_ratio)


def _read_shard(
    path: Path, embed_col: int, embedx_col: int, embedx_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    empty = np.zeros(0, np.uint64), np.zeros((0, embedx_dim + 1), np.float32)
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(autogenerate_column_names=True),
            parse_options=pacsv.ParseOptions(delimiter=" "),
            convert_options=pacsv.ConvertOptions(column_types={"f0": pa.uint64()}),
        )
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):  # servers write an empty gzip for an empty shard
            return empty
        raise ExportInvalid(f"{path}: unreadable sparse shard: {e}") from e
    if table.num_rows == 0:
        return empty
    if table.num_columns < embedx_col + embedx_dim:
        raise ExportInvalid(
            f"{path}: {table.num_columns} columns, expected at least "
            f"{embedx_col + embedx_dim}: the layout does not match the table"
        )
    keys = table.column(0).to_numpy()
    cols = [embed_col, *range(embedx_col, embedx_col + embedx_dim)]
    values = np.stack([table.column(c).to_numpy().astype(np.float32) for c in cols], axis=1)
    return keys, values


def read_save(save_dir: Path, folder: str, layout: dict[str, int]) -> SparseEmbeddings:
    """The sparse table in ``folder`` of one checkpoint save (its files are named
    ``part-<server>-<shard>``); empty when the save has no such folder."""
    table_dir = Path(save_dir) / folder
    if not table_dir.is_dir():
        return empty_embeddings(layout["embedx_dim"] + 1)
    return read_saved_table(table_dir, layout)


def read_saved_table(table_dir: Path, layout: dict[str, int]) -> SparseEmbeddings:
    """All shards under ``table_dir`` (``part-*``) as one sorted SparseEmbeddings."""
    shards = sorted(table_dir.glob("part-*"))
    if not shards:
        raise ExportInvalid(f"{table_dir}: no saved shards")
    parts = [
        _read_shard(s, layout["embed_w_column"], layout["embedx_w_column"], layout["embedx_dim"])
        for s in shards
        if s.stat().st_size > 0
    ]
    keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.uint64)
    values = (
        np.concatenate([v for _, v in parts])
        if parts
        else np.zeros((0, layout["embedx_dim"] + 1), np.float32)
    )
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
        raise ExportInvalid(f"{table_dir}: a key appears in two shards")
    return SparseEmbeddings(keys, values)


@dataclass(frozen=True)
class LayeredTables:
    """A version's sparse tables by name, each a ``LayeredEmbeddings``; immutable."""

    tables: dict[str, LayeredEmbeddings]

    @classmethod
    def of(cls, tables: dict[str, SparseEmbeddings], compact_ratio: float = 0.25) -> LayeredTables:
        return cls({name: LayeredEmbeddings.of(t, compact_ratio) for name, t in tables.items()})

    def lookup(self, table: str, signs: np.ndarray) -> np.ndarray:
        """Embeddings of ``signs`` in ``table``; zeros for keys it never saw."""
        return self.tables[table].lookup(signs)

    def apply(self, delta: dict[str, SparseEmbeddings]) -> LayeredTables:
        """These tables with ``delta``'s keys (by table) over them."""
        return LayeredTables(
            {name: t.apply(delta[name]) if name in delta else t for name, t in self.tables.items()}
        )
