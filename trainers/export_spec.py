"""The raw export's contract: ``export_spec.json``, written by the exporting worker and read
by the packaging step (``serving_export.artifact``) and ``streamrec publish``.

A raw export is a directory of the dense inference program (``<model_prefix>.pdmodel`` and
``.pdiparams``), its ONNX twin, and this spec: what the program feeds on, and the
checkpoint saves that hold the sparse tables the artifact takes its embeddings from. Written
and read here only: a field missing, renamed or of the wrong type fails at the read with
the file's name, instead of as a KeyError deep in packaging.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from streamrec.atomic_fs import write_text_atomic
from streamrec.errors import ContractError, broken_fields
from trainers.checkpoints import CheckpointInfo

EXPORT_SPEC = "export_spec.json"
# 3: the ONNX twin is in the raw export; 4: the network and sequences; 5: several tables
EXPORT_VERSION = 6  # 6: the outputs, a head per task


class OnnxTwin(BaseModel):
    """The dense program as ONNX (``trainers.worker.onnx_twin``): its file, or why there is none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str | None
    opset: int | None = None
    converter: str | None = None
    error: str | None = None


class ExportTable(BaseModel):
    """A sparse table as the checkpoint saves hold it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: str  # the folder of a save that holds the table (its id on the servers)
    dim: int  # the embedding a lookup pulls: embed_w, then embedx_w
    saved_value_layout: dict[str, int]  # where embed_w and embedx_w sit in a saved row
    slots: tuple[str, ...]  # the slots whose keys it holds


class ExportSpec(BaseModel):
    """``export_spec.json``: the model as trained through ``pass_id``, for packaging."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    export_version: int
    pass_id: str
    model: str
    network: str  # the network's import path (model.network)
    model_prefix: str  # the dense program's files: <model_prefix>.pdmodel / .pdiparams
    slot_feeds: dict[str, str]  # pooled slot -> the program's pooled-embedding feed
    sequence_feeds: dict[str, tuple[str, str]]  # sequence slot -> (values, mask) feeds
    dense_feed: str | None  # the dense features' feed; None when the schema has none
    outputs: tuple[str, ...]  # the program's outputs: each task's probability, by label name
    sparse_tables: dict[str, ExportTable]  # by name (the Paddle parameter)
    feature_schema: dict[str, Any]  # streamrec.config.SchemaConfig, as JSON
    checkpoint_root: str
    chain: tuple[CheckpointInfo, ...]  # the saves since the newest base, oldest first
    trained_at: float | None  # epoch seconds the pass finished training
    onnx: OnnxTwin


def write_export_spec(directory: Path, spec: ExportSpec) -> None:
    """Write ``spec`` into a raw export being built (before it is published)."""
    write_text_atomic(Path(directory) / EXPORT_SPEC, spec.model_dump_json(indent=2))


def read_export_spec(raw_export: Path) -> ExportSpec:
    """The spec of a complete raw export; ContractError naming what is wrong."""
    raw_export = Path(raw_export)
    path = raw_export / EXPORT_SPEC
    if not (raw_export / "_SUCCESS").is_file() or not path.is_file():
        raise ContractError(
            f"{raw_export} is not a complete raw export (no _SUCCESS / {EXPORT_SPEC})"
        )
    raw = json.loads(path.read_text())
    if raw.get("export_version", 0) < EXPORT_VERSION:
        raise ContractError(
            f"{path} is of export version {raw.get('export_version')}, this streamrec reads "
            f"{EXPORT_VERSION} (with its sparse tables and its outputs): export the pass again"
        )
    try:
        return ExportSpec.model_validate(raw)
    except ValidationError as e:
        raise ContractError(f"{path} breaks the export spec: {broken_fields(e)}") from None
