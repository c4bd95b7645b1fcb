"""Checkpoint chains on disk: which save comes next, what to restore, what to delete."""

from __future__ import annotations

from pathlib import Path

from trainers.checkpoints import (
    CheckpointInfo,
    ModelSignature,
    SparseTableShape,
    apply_retention,
    list_checkpoints,
    missing_tables,
    next_kind,
    restore_chain,
    write_info,
)


def _save(root: Path, seq: int, pass_id: str, kind: str, parent: str | None = None) -> str:
    info = CheckpointInfo(
        pass_id=pass_id, kind=kind, seq=seq, parent=parent, table_keys=0, saved_keys=0
    )
    (root / info.name).mkdir(parents=True)
    write_info(root / info.name, info)
    return info.name


def test_a_base_every_n_passes() -> None:
    chain: list[CheckpointInfo] = []
    kinds = []
    for seq in range(7):
        kind = next_kind(chain, 3)
        kinds.append(kind)
        info = CheckpointInfo(
            pass_id=f"p{seq}", kind=kind, seq=seq, parent=None, table_keys=0, saved_keys=0
        )
        chain = [info] if info.is_base else [*chain, info]
    assert kinds == ["base", "delta", "delta", "base", "delta", "delta", "base"]
    assert (
        CheckpointInfo(
            pass_id="p", kind="daily", seq=0, parent=None, table_keys=0, saved_keys=0
        ).mode
        == 3
    )


def test_restore_takes_the_newest_complete_chain(tmp_path: Path) -> None:
    base = _save(tmp_path, 0, "202601010000", "base")
    d1 = _save(tmp_path, 1, "202601010010", "delta", base)
    _save(tmp_path, 2, "202601010020", "delta", "202601010015-delta")  # its parent is gone
    (tmp_path / ".202601010030-delta.tmp-x").mkdir()  # an unpublished save
    chain = restore_chain(tmp_path)
    assert [i.name for i in chain] == [base, d1]
    assert restore_chain(tmp_path / "missing") == []


def test_retention_keeps_the_newest_bases_and_their_deltas(tmp_path: Path) -> None:
    names = []
    for seq, kind in enumerate(["base", "delta", "base", "delta", "daily", "delta"]):
        parent = names[-1] if kind == "delta" else None
        names.append(_save(tmp_path, seq, f"2026010100{seq}0", kind, parent))
    gone = apply_retention(tmp_path, keep_bases=2)
    assert gone == names[:2]
    assert [i.name for i in list_checkpoints(tmp_path)] == names[2:]
    assert [i.name for i in restore_chain(tmp_path)] == names[4:]


MODEL = ModelSignature(
    network="n",
    slots={"user_id": "user_id"},
    sparse_tables={
        "emb": SparseTableShape(dim=9, rule="adagrad", row_width=17, table_id=0),
        "wide": SparseTableShape(dim=1, rule="adagrad", row_width=3, table_id=2),
    },
    dense={"b": (1,)},
)


def _with_tables(root: Path, name: str, servers: dict[int, list[int]]) -> None:
    """Give save ``name`` the files its servers wrote: table id -> the servers that did."""
    info = CheckpointInfo.model_validate_json((root / name / "CHECKPOINT.json").read_text())
    write_info(root / name, info.model_copy(update={"model": MODEL}))
    for table_id, wrote in servers.items():
        folder = root / name / f"{table_id:03d}"
        folder.mkdir(exist_ok=True)
        for server in wrote:
            (folder / f"part-{server:03d}-00000").write_text("")  # a shard with no keys


def test_a_save_must_hold_every_sparse_table_from_every_server(tmp_path: Path) -> None:
    name = _save(tmp_path, 0, "202601010000", "base")
    _with_tables(tmp_path, name, {0: [0, 1], 2: [0, 1]})
    assert missing_tables(tmp_path / name, MODEL, servers=2) == []
    _with_tables(tmp_path, name, {})  # the same folders: nothing lost
    assert missing_tables(tmp_path / name, MODEL, servers=3) == [
        "emb (000/): nothing from server [2]",
        "wide (002/): nothing from server [2]",
    ]
    empty = _save(tmp_path, 1, "202601010010", "delta", name)
    assert missing_tables(tmp_path / empty, MODEL, servers=2) == [
        "emb (000/): nothing from server [0, 1]",
        "wide (002/): nothing from server [0, 1]",
    ]
    assert missing_tables(tmp_path / empty, MODEL) == [
        "emb (000/): no file",
        "wide (002/): no file",
    ]


def test_restore_passes_over_a_save_whose_tables_were_not_written(tmp_path: Path) -> None:
    """A delta the servers failed to write (CI, 2026-11-29: only CHECKPOINT.json) is not
    loaded: the chain ends at its parent, where loading it killed the servers."""
    base = _save(tmp_path, 0, "202601010000", "base")
    _with_tables(tmp_path, base, {0: [0], 2: [0]})
    d1 = _save(tmp_path, 1, "202601010010", "delta", base)
    _with_tables(tmp_path, d1, {0: [0], 2: [0]})
    d2 = _save(tmp_path, 2, "202601010020", "delta", d1)
    _with_tables(tmp_path, d2, {})
    assert [i.name for i in restore_chain(tmp_path)] == [base, d1]
    _with_tables(tmp_path, d2, {0: [0], 2: [0]})
    assert [i.name for i in restore_chain(tmp_path)] == [base, d1, d2]
