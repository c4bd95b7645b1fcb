"""Reading the servers' saved sparse table (columns by layout, lookups, bad shards) and
merging saves and versions: newest value wins, layered tables read like a replay."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from serving_export.errors import ExportInvalid
from serving_export.sparse_table import (
    LayeredEmbeddings,
    SparseEmbeddings,
    newest_wins,
    read_save,
    read_saved_table,
)
from streamrec.config import SparseTableConfig, SparseTableSpec
from trainers.worker.strategy import saved_row_width, saved_value_layout

LAYOUT = {"embed_w_column": 6, "embedx_w_column": 8, "embedx_dim": 2}  # adagrad, dim 3


def _line(key: int, w: float, x: tuple[float, float]) -> str:
    # key slot unseen delta show click embed_w embed_g2sum embedx_w[2] embedx_g2sum
    return f"{key} 0 0 1.5 15 1 {w} 0.3 {x[0]} {x[1]} 0.7\n"


def _shard(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(lines)


def test_reads_pulled_values_and_looks_up(tmp_path: Path) -> None:
    big = 2**64 - 5  # feature signs use the whole uint64 range
    _shard(tmp_path / "part-000-00000.gz", [_line(big, 0.5, (1.0, 2.0))])
    _shard(tmp_path / "part-000-00001.gz", [_line(7, -0.5, (3.0, 4.0))])
    _shard(tmp_path / "part-000-00002.gz", [])
    table = read_saved_table(tmp_path, LAYOUT)
    assert table.keys.tolist() == [7, big]
    got = table.lookup(np.array([big, 7, 12345], dtype=np.uint64))
    np.testing.assert_allclose(got, [[0.5, 1.0, 2.0], [-0.5, 3.0, 4.0], [0, 0, 0]])


def test_layout_mismatch_and_duplicates_fail(tmp_path: Path) -> None:
    _shard(tmp_path / "part-000-00000.gz", ["1 0 0 1 1 0 0.1 0.2\n"])
    with pytest.raises(ExportInvalid, match="layout"):
        read_saved_table(tmp_path, LAYOUT)
    other = tmp_path / "dup"
    other.mkdir()
    _shard(other / "part-000-00000.gz", [_line(3, 0.1, (0, 0))])
    _shard(other / "part-000-00001.gz", [_line(3, 0.2, (0, 0))])
    with pytest.raises(ExportInvalid, match="two shards"):
        read_saved_table(other, LAYOUT)


@pytest.mark.parametrize(
    ("rule", "embedx_col"), [("naive", 7), ("adagrad", 8), ("std_adagrad", 8), ("adam", 11)]
)
def test_layout_follows_the_sgd_rule(rule: str, embedx_col: int) -> None:
    for dim in (9, 4):
        table = SparseTableSpec("t", dim, SparseTableConfig(rule=rule), ("a",))
        layout = saved_value_layout(table)
        assert (layout.embed_w_column, layout.embedx_w_column) == (6, embedx_col)
        assert layout.embedx_dim == dim - 1
        state = {"naive": 0, "adagrad": 1, "std_adagrad": dim - 1, "adam": 2 * (dim - 1) + 2}
        assert saved_row_width(table) == embedx_col + dim - 1 + state[rule]


def _table(keys: list[int], fill: list[float]) -> SparseEmbeddings:
    values = np.array([[v, v] for v in fill], dtype=np.float32).reshape(-1, 2)
    return SparseEmbeddings(np.array(keys, dtype=np.uint64), values)


def test_newest_wins_merges_in_order() -> None:
    merged = newest_wins(
        [_table([1, 5, 9], [1, 5, 9]), _table([5, 7], [50, 70]), _table([9], [90])]
    )
    assert merged.keys.tolist() == [1, 5, 7, 9]
    assert merged.values[:, 0].tolist() == [1, 50, 70, 90]


@given(
    st.lists(
        st.dictionaries(st.integers(0, 50), st.floats(-1, 1, width=32), max_size=30),
        min_size=1,
        max_size=6,
    )
)
def test_layered_table_equals_a_dict_of_newest_values(updates: list[dict[int, float]]) -> None:
    """Applying deltas (with compaction at any point) reads like replaying them into a dict."""

    def as_table(update: dict[int, float]) -> SparseEmbeddings:
        keys = sorted(update)
        return _table(keys, [update[k] for k in keys])

    oracle = dict(updates[0])
    layered = LayeredEmbeddings.of(as_table(updates[0]), compact_ratio=0.3)
    for update in updates[1:]:
        layered = layered.apply(as_table(update))
        oracle.update(update)
    probe = np.arange(0, 60, dtype=np.uint64)
    expected = np.array([[oracle.get(k, 0.0)] * 2 for k in range(60)], dtype=np.float32)
    np.testing.assert_array_equal(layered.lookup(probe), expected)
    assert len(layered) == len(oracle)


def test_overlay_is_folded_into_the_base_when_it_outgrows_it() -> None:
    base = _table(list(range(100)), [0.0] * 100)
    small = LayeredEmbeddings.of(base, compact_ratio=0.25).apply(_table([1, 2], [1, 2]))
    assert len(small.overlay.keys) == 2 and len(small.base.keys) == 100
    big = small.apply(_table(list(range(100, 130)), [1.0] * 30))
    assert len(big.overlay.keys) == 0 and len(big.base.keys) == 130


def test_read_save_reads_each_table_from_its_folder(tmp_path: Path) -> None:
    for folder in ("000", "001", "002"):
        (tmp_path / folder).mkdir()
    _shard(tmp_path / "000" / "part-000-00000.gz", [_line(3, 0.25, (1.0, 2.0))])
    narrow = {"embed_w_column": 6, "embedx_w_column": 7, "embedx_dim": 1}  # naive, dim 2
    _shard(tmp_path / "001" / "part-000-00000.gz", ["3 0 0 1 1 0 0.5 4.0\n"])
    (tmp_path / "002" / "part-000.gz").write_bytes(gzip.compress(b"0.1 0.2\n"))  # dense
    wide, small = read_save(tmp_path, "000", LAYOUT), read_save(tmp_path, "001", narrow)
    assert wide.keys.tolist() == small.keys.tolist() == [3]  # a key per table, apart
    np.testing.assert_allclose(wide.values, [[0.25, 1.0, 2.0]])
    np.testing.assert_allclose(small.values, [[0.5, 4.0]])
    with pytest.raises(ExportInvalid, match="layout"):  # a folder read as the wrong table
        read_save(tmp_path, "001", LAYOUT)
    assert len(read_save(tmp_path, "005", LAYOUT).keys) == 0
