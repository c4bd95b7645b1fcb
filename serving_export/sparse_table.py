"""Read the sparse table the parameter servers saved into key -> embedding arrays.

Servers write each shard as gzip text, one key per line, space-separated: the key, the
accessor's counters, then the embedding and its optimizer state. The export spec's
``saved_value_layout`` says which columns hold ``embed_w`` and ``embedx_w``; the pulled
embedding (what training looked up) is ``[embed_w, embedx_w...]``. Parsing is columnar
(pyarrow's CSV reader), not a Python loop per line.
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

    def lookup(self, signs: np.ndarray) -> np.ndarray:
        """Embeddings of ``signs``; zeros for keys the table never saw (cold start)."""
        signs = np.asarray(signs, dtype=np.uint64)
        out = np.zeros((len(signs), self.values.shape[1]), dtype=np.float32)
        if len(self.keys) == 0:
            return out
        idx = np.searchsorted(self.keys, signs)
        idx_clipped = np.minimum(idx, len(self.keys) - 1)
        hit = self.keys[idx_clipped] == signs
        out[hit] = self.values[idx_clipped[hit]]
        return out


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
