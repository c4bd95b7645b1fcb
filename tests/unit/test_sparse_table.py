"""Reading the servers' saved sparse table: columns by layout, lookups, bad shards."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from serving_export.errors import ExportInvalid
from serving_export.sparse_table import read_saved_table
from streamrec.config import ModelConfig
from trainers.strategy import saved_value_layout

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
def test_layout_follows_the_sgd_rule(shipped_config, rule: str, embedx_col: int) -> None:
    model = ModelConfig.model_validate(
        {
            **shipped_config.model.model_dump(by_alias=True),
            "hyper_parameters": {
                **shipped_config.model.hyper_parameters.model_dump(by_alias=True),
                "sparse_table": {"rule": rule},
            },
        }
    )
    layout = saved_value_layout(model)
    assert (layout.embed_w_column, layout.embedx_w_column, layout.embedx_dim) == (6, embedx_col, 8)
