"""Package a raw cluster export into a versioned, self-contained serving artifact.

    <model_root>/<model>/<version>/
        model.pdmodel, model.pdiparams   Paddle inference model: pooled embeddings + dense -> p
        sparse/keys.npy, sparse/values.npy  sorted feature signs and their embeddings
        MANIFEST.json                     ARTIFACT_VERSION, pass id, metrics, feeds, schema,
                                          sha256 of every file

The directory is built under a temporary name and renamed into place, so an artifact
either exists whole or not at all. The version is the pass id: packaging the same pass
again finds the published artifact and returns its manifest.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from serving_export.errors import ExportInvalid
from serving_export.sparse_table import read_saved_table
from streaming.feature_signs import SIGN_VERSION
from streamrec.atomic_fs import publish_dir, sha256_file, temp_dir_for
from streamrec.config import PipelineConfig

log = logging.getLogger(__name__)

ARTIFACT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
MODEL_PREFIX = "model"


def artifact_dir(cfg: PipelineConfig, version: str) -> Path:
    """Where version ``version`` of this pipeline's model lives."""
    return Path(cfg.paths.model_root) / cfg.model.model / version


def _convert_program(plugin_dir: Path, feeds: list[str], out_prefix: Path) -> None:
    """fleet's dnn_plugin (pickled program + one file per parameter) -> a standard
    inference model that Paddle Inference loads without fleet."""
    import paddle

    paddle.enable_static()
    program = paddle.load(str(plugin_dir / "__model__"))
    block = program.global_block()
    fetches = [op.input("X")[0] for op in block.ops if op.type == "fetch"]
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        for var in program.list_vars():
            param_file = plugin_dir / var.name
            if var.persistable and param_file.is_file():
                scope.var(var.name).get_tensor().set(
                    np.asarray(paddle.load(str(param_file))), paddle.CPUPlace()
                )
        paddle.static.save_inference_model(
            str(out_prefix),
            [block.var(n) for n in feeds],
            [block.var(n) for n in fetches],
            exe,
            program=program,
        )


def package_export(
    cfg: PipelineConfig, raw_export: Path, metrics: dict[str, Any]
) -> dict[str, Any]:
    """Build, verify and publish the artifact of a raw export; its manifest."""
    raw_export = Path(raw_export)
    spec_path = raw_export / "export_spec.json"
    if not (raw_export / "_SUCCESS").is_file() or not spec_path.is_file():
        raise ExportInvalid(
            f"{raw_export} is not a complete raw export (no _SUCCESS / export_spec.json)"
        )
    spec = json.loads(spec_path.read_text())
    version = spec["pass_id"]
    final = artifact_dir(cfg, version)
    if (final / MANIFEST_NAME).is_file():
        log.info("artifact %s already published", final)
        return json.loads((final / MANIFEST_NAME).read_text())

    tmp = temp_dir_for(final)
    slot_feeds: dict[str, str] = spec["slot_feeds"]
    feeds = list(slot_feeds.values()) + ([spec["dense_feed"]] if spec["dense_feed"] else [])
    _convert_program(raw_export / spec["program_dir"], feeds, tmp / MODEL_PREFIX)
    tables = [
        read_saved_table(raw_export / d, spec["saved_value_layout"]) for d in spec["sparse_dirs"]
    ]
    if len(tables) != 1:
        raise ExportInvalid(f"{raw_export}: expected one sparse table, found {len(tables)}")
    (tmp / "sparse").mkdir()
    np.save(tmp / "sparse" / "keys.npy", tables[0].keys)
    np.save(tmp / "sparse" / "values.npy", tables[0].values)

    files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {
        "artifact_version": ARTIFACT_VERSION,
        "model": cfg.model.model,
        "version": version,
        "pass_id": spec["pass_id"],
        "created_at": datetime.now(UTC).isoformat(),
        "metrics": metrics,
        "slot_feeds": slot_feeds,
        "dense_feed": spec["dense_feed"],
        "embedding_dim": spec["embedding_dim"],
        "sign_version": SIGN_VERSION,
        "feature_schema": spec["feature_schema"],
        "sparse_keys": len(tables[0].keys),
        "files": files,
    }
    (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
    publish_dir(tmp, final)
    log.info("artifact %s published (%d sparse keys)", final, manifest["sparse_keys"])
    return manifest


def verify_artifact(directory: Path) -> dict[str, Any]:
    """The manifest of ``directory`` after checking every file against its sha256."""
    manifest_path = Path(directory) / MANIFEST_NAME
    if not manifest_path.is_file():
        raise ExportInvalid(f"{directory}: no {MANIFEST_NAME}")
    manifest = json.loads(manifest_path.read_text())
    for rel, digest in manifest["files"].items():
        path = Path(directory) / rel
        if not path.is_file() or sha256_file(path) != digest:
            raise ExportInvalid(f"{path}: missing or checksum mismatch")
    return manifest
