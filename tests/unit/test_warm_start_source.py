"""Where a warm start's model comes from and what must fit: the saves a path names (a
checkpoint root's newest chain, one save with its parents, a directory Paddle's PS saved),
and every difference between the saved and the configured model named."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from streamrec.config import PipelineConfig, derived
from streamrec.errors import ConfigError
from trainers.checkpoints import CheckpointInfo, ModelSignature, SparseTableShape, write_info
from trainers.warm_start import check_warm_start, differences, warm_start_source

SIG = ModelSignature(
    network="trainers.networks:CtrDnn",
    slots={"user_id": "user_id", "item_id": "item_id"},
    sparse_tables={"SparseFeatFactors": SparseTableShape(dim=9, rule="adagrad", row_width=17)},
    dense={"dnn.fc0.w": (2, 4), "dnn.fc0.b": (4,), "streamrec.logit_bias": (1,)},
)


def _save(root: Path, pass_id: str, kind: str, seq: int, parent: str | None) -> Path:
    info = CheckpointInfo(
        pass_id=pass_id,
        kind=kind,
        seq=seq,
        parent=parent,
        table_keys=1,
        saved_keys=1,
        model=SIG,
    )
    directory = root / info.name
    _tables(directory, width=17, dense_values=13)
    write_info(directory, info)
    return directory


def _tables(directory: Path, width: int, dense_values: int) -> None:
    (directory / "000").mkdir(parents=True)
    (directory / "001").mkdir()
    with gzip.open(directory / "000" / "part-000-00000.gz", "wt") as f:
        f.write(" ".join(["7"] * width) + "\n")
    with gzip.open(directory / "001" / "part-000.gz", "wt") as f:
        f.write("0.1 0 0\n" * dense_values)


def test_a_root_a_save_and_a_paddle_directory_name_their_saves(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    base = _save(root, "202601010000", "base", 0, None)
    d1 = _save(root, "202601010010", "delta", 1, base.name)
    d2 = _save(root, "202601010020", "delta", 2, d1.name)
    assert warm_start_source(root).saves == (base, d1, d2)  # the newest chain
    assert warm_start_source(d1).saves == (base, d1)  # a save with what it builds on
    assert warm_start_source(base).signature == SIG
    paddle_dir = tmp_path / "paddle"
    _tables(paddle_dir, width=17, dense_values=13)
    source = warm_start_source(paddle_dir)
    assert source.saves == (paddle_dir,) and source.signature is None
    with pytest.raises(ConfigError, match=r"checkpoints\.warm_start: .* holds no model"):
        warm_start_source(tmp_path / "empty")


def test_every_difference_is_named() -> None:
    assert differences(SIG, SIG) == []
    ours = SIG.model_copy(
        update={
            "network": "din:Din",
            "slots": {"user_id": "user_id", "clicked": "item_id"},
            "sparse_tables": {
                "SparseFeatFactors": SparseTableShape(dim=5, rule="adagrad", row_width=13)
            },
            "dense": {**SIG.dense, "dnn.fc0.w": (3, 4)},
        }
    )
    found = differences(SIG, ours)
    assert found[0] == "network: saved trainers.networks:CtrDnn, configured din:Din"
    assert "slot clicked is not in the saved model" in found
    assert "slot item_id is in the saved model only" in found
    assert any(f.startswith("sparse table SparseFeatFactors: saved dim 9") for f in found)
    assert "dense parameter dnn.fc0.w: saved [2, 4], configured [3, 4]" in found
    renamed = SIG.model_copy(update={"network": "mypkg:SameNet"})
    assert differences(SIG, renamed) == []  # the same parameters under another name fit


def test_a_paddle_directory_is_checked_by_row_width_and_dense_values(
    shipped_config: PipelineConfig, tmp_path: Path
) -> None:
    paddle_dir = tmp_path / "paddle"
    _tables(paddle_dir, width=17, dense_values=12)
    cfg = derived(
        shipped_config,
        "test",
        paths={"checkpoint_root": str(tmp_path / "own")},
        checkpoints={"warm_start": str(paddle_dir)},
    )
    with pytest.raises(ConfigError, match="12 dense values saved, this network has 13"):
        check_warm_start(cfg, SIG)
    narrow = SIG.model_copy(
        update={
            "sparse_tables": {
                "SparseFeatFactors": SparseTableShape(dim=5, rule="adagrad", row_width=13)
            }
        }
    )
    with pytest.raises(ConfigError, match="rows have 17 columns, this model's 13"):
        check_warm_start(cfg, narrow)
    # once the pipeline has saves of its own, they are restored and the warm start ignored
    _save(tmp_path / "own", "202601010000", "base", 0, None)
    assert check_warm_start(cfg, narrow) is None
