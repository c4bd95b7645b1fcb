"""Checkpoint chains on disk: which save comes next, what to restore, what to delete."""

from __future__ import annotations

from pathlib import Path

from trainers.checkpoints import (
    CheckpointInfo,
    apply_retention,
    list_checkpoints,
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
