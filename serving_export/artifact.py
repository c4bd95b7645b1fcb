"""Package a raw cluster export into a versioned serving artifact: full or delta.

    <model_root>/<model>/<version>/
        model.pdmodel, model.pdiparams   Paddle inference model: pooled embeddings + dense -> p
        model.onnx                        the same program as ONNX (when paddle2onnx converts it)
        sparse/<table>/keys.npy, values.npy  per sparse table, sorted feature signs and their
                                          embeddings: every key (a full version) or the keys
                                          changed since the parent version (a delta)
        MANIFEST.json                     serving_export.manifest.ArtifactManifest: pass id,
                                          metrics, feeds, schema, sparse {kind, parent},
                                          freshness, sha256 of every file

The embeddings come from the cluster's checkpoint saves named by the export (the model's
chain: a base or daily save, then deltas). A version is a delta when the previous published
version's chain is a prefix of this one's: it carries only the saves after that prefix, the
keys the passes since touched. After a base or daily save the chain restarts, and the version
is full; so is the first one. ``lineage`` walks a version back to its full ancestor, which is
how consumers rebuild it. Shrink deletes keys only before a daily save, which restarts the
chain, so the next version is full: a consumer that loads a full version replaces its table,
and deleted keys leave serving.

The directory is built under a temporary name and renamed into place, so an artifact
either exists whole or not at all. The version is the pass id: packaging the same pass
again finds the published artifact and returns its manifest.
"""

from __future__ import annotations

import logging
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from serving_export.errors import ExportInvalid
from serving_export.manifest import (
    ARTIFACT_MANIFEST_NAME,
    ARTIFACT_VERSION,
    ArtifactManifest,
    ArtifactMetrics,
    Freshness,
    SparsePart,
    TablePart,
)
from serving_export.sparse_table import SparseEmbeddings, newest_wins, read_save
from streaming.feature_signs import SIGN_VERSION
from streamrec.atomic_fs import publish_dir, remove_leftovers, sha256_file, temp_dir_for
from streamrec.config import PipelineConfig
from streamrec.contracts.delivery import GateDecision
from streamrec.layout import Layout
from streamrec.listing import Listing, list_folder
from streamrec.passes import pass_dir, read_manifest
from trainers.export_spec import ExportSpec, read_export_spec

log = logging.getLogger(__name__)

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MODEL_PREFIX = "model"
ONNX_NAME = "model.onnx"


def artifact_dir(cfg: PipelineConfig, version: str) -> Path:
    """Where version ``version`` of this pipeline's model lives."""
    return version_dir(Layout.of(cfg.paths).model_dir(cfg.model.model), version)


def version_dir(model_dir: Path, version: str) -> Path:
    """``model_dir / version``; ExportInvalid unless ``version`` is one plain directory
    name (names come from Redis and from manifests: ``../x`` must not reach outside)."""
    if not isinstance(version, str) or not _PLAIN_NAME.fullmatch(version):
        raise ExportInvalid(f"version {version!r} is not a plain directory name: refused")
    return Path(model_dir) / version


def read_published(directory: Path) -> ArtifactManifest | None:
    """The manifest of a published artifact directory, None when there is none."""
    path = Path(directory) / ARTIFACT_MANIFEST_NAME
    return ArtifactManifest.parse(path.read_text(), str(path)) if path.is_file() else None


def version_listing(model_dir: Path) -> Listing:
    """The version folders of a model (plain names) and the writers' temporaries."""
    return list_folder(model_dir, lambda name: _PLAIN_NAME.fullmatch(name) is not None)


def _parent(model_dir: Path, version: str, chain: tuple[str, ...]) -> ArtifactManifest | None:
    """The newest published version before ``version`` when this chain extends its chain."""
    earlier = [name for name in version_listing(model_dir).names if name < version]
    for name in reversed(earlier):
        manifest = read_published(model_dir / name)
        if manifest is None:
            continue
        prior = manifest.chain
        if len(chain) > len(prior) > 0 and chain[: len(prior)] == prior:
            return manifest
        return None
    return None


def _freshness(cfg: PipelineConfig, spec: ExportSpec) -> Freshness:
    """When the version's data ended (event time), became a complete pass and was trained;
    ``created_at`` is when it was published, the registry adds when it began serving."""
    pass_manifest = read_manifest(pass_dir(cfg.paths.data_root, spec.pass_id))
    trained_at = spec.trained_at
    return Freshness(
        window_end=datetime.fromtimestamp(pass_manifest.window_end_ms / 1000, UTC).isoformat(),
        pass_completed_at=pass_manifest.created_at,
        trained_at=datetime.fromtimestamp(trained_at, UTC).isoformat() if trained_at else None,
    )


def package_export(
    cfg: PipelineConfig, raw_export: Path, decision: GateDecision
) -> ArtifactManifest:
    """Build, verify and publish the artifact of a raw export that passed the gate with
    ``decision``; its manifest."""
    raw_export = Path(raw_export)
    spec = read_export_spec(raw_export)
    version = spec.pass_id
    final = artifact_dir(cfg, version)
    published = read_published(final)
    if published is not None:
        log.info("artifact %s already published", final)
        return published

    grace_s = cfg.retention.leftover_minutes * 60
    for removed in remove_leftovers(version_listing(final.parent).leftovers, grace_s):
        log.info("removed a crashed writer's leftover %s: %s", removed.path, removed.why)
    chain = tuple(c.name for c in spec.chain)
    parent = _parent(final.parent, version, chain)
    saves = chain[len(parent.chain) :] if parent else chain
    root = Path(spec.checkpoint_root)
    missing = [name for name in saves if not (root / name).is_dir()]
    if missing:
        raise ExportInvalid(f"{raw_export}: checkpoint saves {missing} are gone from {root}")
    tables: dict[str, SparseEmbeddings] = {
        table: newest_wins(
            [read_save(root / name, t.folder, t.saved_value_layout) for name in saves]
        )
        for table, t in spec.sparse_tables.items()
    }

    tmp = temp_dir_for(final)
    for suffix in (".pdmodel", ".pdiparams"):
        shutil.copyfile(
            raw_export / f"{spec.model_prefix}{suffix}", tmp / f"{MODEL_PREFIX}{suffix}"
        )
    onnx = spec.onnx
    if onnx.file:  # written by the exporting worker (trainers.worker.onnx_twin)
        shutil.copyfile(raw_export / onnx.file, tmp / ONNX_NAME)
        onnx = onnx.model_copy(update={"file": ONNX_NAME})
    for name, table in tables.items():
        (tmp / "sparse" / name).mkdir(parents=True)
        np.save(tmp / "sparse" / name / "keys.npy", table.keys)
        np.save(tmp / "sparse" / name / "values.npy", table.values)

    files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = ArtifactManifest(
        artifact_version=ARTIFACT_VERSION,
        model=cfg.model.model,
        version=version,
        pass_id=spec.pass_id,
        created_at=datetime.now(UTC).isoformat(),
        metrics=ArtifactMetrics(auc=decision.auc, gate=decision),
        network=spec.network,
        slot_feeds=spec.slot_feeds,
        sequence_feeds=spec.sequence_feeds,
        dense_feed=spec.dense_feed,
        outputs=spec.outputs,
        sparse_tables={
            name: TablePart(dim=t.dim, slots=t.slots, keys=len(tables[name].keys))
            for name, t in spec.sparse_tables.items()
        },
        sign_version=SIGN_VERSION,
        feature_schema=spec.feature_schema,
        sparse=SparsePart(
            kind="delta" if parent else "full",
            parent=parent.version if parent else None,
            keys=sum(len(t.keys) for t in tables.values()),
            table_keys=spec.chain[-1].table_keys,
        ),
        chain=chain,
        onnx=onnx,
        freshness=_freshness(cfg, spec),
        files=files,
    )
    (tmp / ARTIFACT_MANIFEST_NAME).write_text(manifest.to_json())
    publish_dir(tmp, final)
    sparse = manifest.sparse
    log.info(
        "artifact %s published: %s, %d of %d keys",
        final,
        sparse.kind + (f" on {sparse.parent}" if sparse.parent else ""),
        sparse.keys,
        sparse.table_keys,
    )
    return manifest


def _delta_parent(manifest: ArtifactManifest) -> str:
    """The version a delta builds on."""
    if manifest.sparse.parent is None:
        raise ExportInvalid(f"version {manifest.version} is a delta naming no parent")
    return manifest.sparse.parent


def lineage(model_dir: Path, version: str) -> list[ArtifactManifest]:
    """Verified manifests from the full version ``version`` builds on, to ``version``."""
    chain = [verify_artifact(version_dir(model_dir, version))]
    while chain[-1].sparse.kind == "delta":
        parent = _delta_parent(chain[-1])
        if not version_dir(model_dir, parent).is_dir():
            raise ExportInvalid(
                f"version {chain[0].version} needs {parent}, which is gone from {model_dir}"
            )
        chain.append(verify_artifact(version_dir(model_dir, parent)))
    return chain[::-1]


def ancestors(model_dir: Path, version: str) -> list[str]:
    """The versions ``version`` builds on (its delta parents back to a full version), read
    from the published manifests without verifying them; stops where one is gone."""
    found = []
    manifest = read_published(version_dir(model_dir, version))
    while manifest is not None and manifest.sparse.kind == "delta":
        parent = _delta_parent(manifest)
        found.append(parent)
        manifest = read_published(version_dir(model_dir, parent))
    return found


def load_sparse(directory: Path, manifest: ArtifactManifest) -> dict[str, SparseEmbeddings]:
    """The sparse tables of one artifact by name (every key, or a delta's changed keys)."""
    return {
        name: SparseEmbeddings(
            np.load(Path(directory) / "sparse" / name / "keys.npy"),
            np.load(Path(directory) / "sparse" / name / "values.npy"),
        )
        for name in manifest.sparse_tables
    }


def verify_artifact(directory: Path) -> ArtifactManifest:
    """The manifest of ``directory`` after checking every file against its sha256; a file
    the manifest places outside ``directory`` (``../``, absolute, a symlink out) is refused."""
    manifest_path = Path(directory) / ARTIFACT_MANIFEST_NAME
    if not manifest_path.is_file():
        raise ExportInvalid(f"{directory}: no {ARTIFACT_MANIFEST_NAME}")
    manifest = ArtifactManifest.parse(manifest_path.read_text(), str(manifest_path))
    root = Path(directory).resolve()
    for rel, digest in manifest.files.items():
        path = Path(directory) / rel
        if Path(rel).is_absolute() or not path.resolve().is_relative_to(root):
            raise ExportInvalid(f"{manifest_path}: file {rel!r} is outside the artifact: refused")
        if not path.is_file() or sha256_file(path) != digest:
            raise ExportInvalid(f"{path}: missing or checksum mismatch")
    return manifest
