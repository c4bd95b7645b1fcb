"""The raw export's contract (``export_spec.json``): written and read in one place, and a
spec that breaks it fails at the read, naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrec.errors import ContractError
from trainers.checkpoints import CheckpointInfo
from trainers.export_spec import (
    EXPORT_SPEC,
    EXPORT_VERSION,
    ExportSpec,
    ExportTable,
    OnnxTwin,
    read_export_spec,
    write_export_spec,
)


def _spec() -> ExportSpec:
    save = CheckpointInfo(
        pass_id="202601010000", kind="base", seq=1, parent=None, table_keys=7, saved_keys=7
    )
    return ExportSpec(
        export_version=EXPORT_VERSION,
        pass_id="202601010000",
        model="ctr_dnn",
        network="trainers.networks:CtrDnn",
        model_prefix="model",
        slot_feeds={"user_id": "pooled_user_id"},
        sequence_feeds={"clicked": ("clicked_values", "clicked_mask")},
        dense_feed=None,
        outputs=("click", "conversion"),
        sparse_tables={
            "SparseFeatFactors": ExportTable(
                folder="000",
                dim=9,
                saved_value_layout={"embed_w": 5, "embedx_w": 7},
                slots=("user_id", "clicked"),
            )
        },
        feature_schema={"version": 1},
        checkpoint_root="/ckpt",
        chain=(save,),
        trained_at=1767225600.5,
        onnx=OnnxTwin(file="model.onnx", opset=13, converter="paddle2onnx"),
    )


def _raw(tmp_path: Path, spec: ExportSpec) -> Path:
    write_export_spec(tmp_path, spec)
    (tmp_path / "_SUCCESS").touch()
    return tmp_path


def test_a_written_spec_reads_back_equal(tmp_path: Path) -> None:
    spec = _spec()
    assert read_export_spec(_raw(tmp_path, spec)) == spec
    assert read_export_spec(tmp_path).chain[0].name == "202601010000-base"


def test_an_incomplete_export_is_refused(tmp_path: Path) -> None:
    write_export_spec(tmp_path, _spec())  # no _SUCCESS: the export was never published
    with pytest.raises(ContractError, match="not a complete raw export"):
        read_export_spec(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: raw.pop("slot_feeds"), "slot_feeds"),
        (lambda raw: raw.update(tables=raw.pop("sparse_tables")), "sparse_tables"),
        (lambda raw: raw.update(trained_at="yesterday"), "trained_at"),
        (lambda raw: raw.update(export_version=2), "export the pass again"),
    ],
)
def test_a_missing_renamed_or_old_field_fails_at_the_read(tmp_path: Path, change, message) -> None:
    path = _raw(tmp_path, _spec()) / EXPORT_SPEC
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match=message) as failed:
        read_export_spec(tmp_path)
    assert EXPORT_SPEC in str(failed.value)
