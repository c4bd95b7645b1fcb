"""Versions as full tables and deltas: which version a delta builds on, and rebuilding any
version from its full ancestor (the in-process store reuses what it built last)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from serving_export.artifact import _parent, ancestors, lineage
from serving_export.errors import ExportInvalid
from serving_export.sparse_store import InProcessStore
from streamrec.atomic_fs import sha256_file
from streamrec.config import DEFAULT_SPARSE_TABLE


def _publish(
    manifest_of,
    model_dir: Path,
    version: str,
    chain: list[str],
    parent: str | None,
    table: dict[int, float],
) -> None:
    d = model_dir / version
    sparse = d / "sparse" / DEFAULT_SPARSE_TABLE
    sparse.mkdir(parents=True)
    keys = np.array(sorted(table), dtype=np.uint64)
    np.save(sparse / "keys.npy", keys)
    np.save(
        sparse / "values.npy",
        np.array([[table[k]] for k in sorted(table)], dtype=np.float32).reshape(-1, 1),
    )
    files = {
        f"sparse/{DEFAULT_SPARSE_TABLE}/{n}": sha256_file(sparse / n)
        for n in ("keys.npy", "values.npy")
    }
    manifest = manifest_of(version, parent=parent, chain=chain, files=files, keys=len(keys))
    (d / "MANIFEST.json").write_text(manifest.to_json())


@pytest.fixture
def model_dir(tmp_path: Path, artifact_manifest) -> Path:
    m = tmp_path / "ctr_dnn"
    publish = partial(_publish, artifact_manifest, m)
    publish("0100", ["0100-base"], None, {1: 1.0, 2: 2.0, 3: 3.0})
    publish("0110", ["0100-base", "0110-delta"], "0100", {2: 20.0})
    publish("0120", ["0100-base", "0110-delta", "0120-delta"], "0110", {3: 30.0, 4: 40.0})
    return m


def test_a_version_builds_on_the_newest_earlier_one_whose_chain_it_extends(model_dir) -> None:
    chain = ("0100-base", "0110-delta", "0120-delta", "0130-delta")
    assert _parent(model_dir, "0130", chain).version == "0120"
    # a new base, or a chain from another lineage (a restored older save): full
    assert _parent(model_dir, "0130", ("0130-base",)) is None
    assert _parent(model_dir, "0130", ("0100-base", "0125-delta")) is None
    assert _parent(model_dir, "0050", ("0050-base",)) is None


def test_lineage_runs_from_the_full_version(model_dir: Path) -> None:
    assert [m.version for m in lineage(model_dir, "0120")] == ["0100", "0110", "0120"]
    assert ancestors(model_dir, "0120") == ["0110", "0100"]
    assert ancestors(model_dir, "0100") == []


def test_in_process_store_rebuilds_any_version(model_dir: Path) -> None:
    store = InProcessStore(model_dir)
    probe = np.arange(6, dtype=np.uint64)
    np.testing.assert_array_equal(
        store.embeddings_for("0120").lookup(DEFAULT_SPARSE_TABLE, probe)[:, 0],
        [0, 1, 20, 30, 40, 0],
    )
    np.testing.assert_array_equal(  # a rollback to an ancestor: rebuilt from the full one
        store.embeddings_for("0110").lookup(DEFAULT_SPARSE_TABLE, probe)[:, 0], [0, 1, 20, 3, 0, 0]
    )
    np.testing.assert_array_equal(
        store.embeddings_for("0100").lookup(DEFAULT_SPARSE_TABLE, probe)[:, 0], [0, 1, 2, 3, 0, 0]
    )


def test_a_missing_or_corrupt_ancestor_is_an_error(model_dir: Path) -> None:
    np.save(
        model_dir / "0110" / "sparse" / DEFAULT_SPARSE_TABLE / "keys.npy",
        np.array([9], dtype=np.uint64),
    )
    with pytest.raises(ExportInvalid, match="checksum"):
        lineage(model_dir, "0120")
    for f in (model_dir / "0110").rglob("*"):
        if f.is_file():
            f.unlink()
    with pytest.raises(ExportInvalid):
        lineage(model_dir, "0120")


def test_names_and_files_that_escape_the_model_root_are_refused(model_dir: Path) -> None:
    outside = model_dir.parent / "outside.npy"  # a file the manifest's checksum matches
    np.save(outside, np.array([7], dtype=np.uint64))
    manifest_path = model_dir / "0100" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    for rel in ("../../outside.npy", str(outside)):
        manifest["files"] = {rel: sha256_file(outside)}
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(ExportInvalid, match="outside the artifact"):
            lineage(model_dir, "0100")
    # a symlink inside the artifact that points out of it
    (model_dir / "0100" / "link.npy").symlink_to(outside)
    manifest["files"] = {"link.npy": sha256_file(outside)}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ExportInvalid, match="outside the artifact"):
        lineage(model_dir, "0100")
    # a delta whose parent names a directory outside, and version names from Redis
    (model_dir.parent / "evil").mkdir()
    delta = json.loads((model_dir / "0110" / "MANIFEST.json").read_text())
    delta["sparse"]["parent"] = "../evil"
    (model_dir / "0110" / "MANIFEST.json").write_text(json.dumps(delta))
    for version, call in (("0110", lineage), ("0110", ancestors), ("../evil", lineage)):
        with pytest.raises(ExportInvalid, match="not a plain directory name"):
            call(model_dir, version)
    for name in ("..", ".hidden", "a/b", "", "0100/../../x"):
        with pytest.raises(ExportInvalid, match="not a plain directory name"):
            InProcessStore(model_dir).embeddings_for(name)


def test_a_manifest_that_breaks_its_contract_fails_naming_the_field(model_dir: Path) -> None:
    """A field missing, renamed or of the wrong type fails where the manifest is read,
    naming the file and the field, not as a KeyError where a request reads it."""
    path = model_dir / "0110" / "MANIFEST.json"
    good = json.loads(path.read_text())
    renamed = {k: v for k, v in good.items() if k != "sign_version"} | {"sign_ver": 1}
    wrong = good | {"sparse": {**good["sparse"], "kind": "partial"}}
    orphan = good | {"sparse": {**good["sparse"], "parent": None}}
    for broken, field in ((renamed, "sign_version"), (wrong, "sparse.kind"), (orphan, "sparse")):
        path.write_text(json.dumps(broken))
        with pytest.raises(ExportInvalid, match=rf"(?s){path}.*{field}"):
            lineage(model_dir, "0110")
