"""Publishing a slice or a pass directory: a rename lost to another writer's complete
directory is "someone else won"; any other failure of the rename is raised, never taken
for a lost race (a full or read-only disk would otherwise look like another builder's
slice, and the partition would resume from a slice that does not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from streaming.slices import _publish
from streamrec.atomic_fs import temp_dir_for
from streamrec.passes import is_complete


class _Manifest(BaseModel):
    rows: int


def _staged(final: Path) -> Path:
    tmp = temp_dir_for(final)
    (tmp / "part-00000.parquet").write_bytes(b"rows")
    return tmp


def test_a_rename_lost_to_a_complete_directory_is_another_writers_win(tmp_path: Path) -> None:
    final = tmp_path / "p0"
    assert _publish(_staged(final), final, "_slice.json", _Manifest(rows=1))
    second = _staged(final)
    assert not _publish(second, final, "_slice.json", _Manifest(rows=2))
    assert not second.exists()  # the loser's copy is removed
    assert is_complete(final)
    assert _Manifest.model_validate_json((final / "_slice.json").read_text()).rows == 1


def test_any_other_rename_failure_is_raised(tmp_path: Path) -> None:
    final = tmp_path / "p0"
    tmp = _staged(final)
    final.write_text("not a slice")  # the rename fails, and nobody published a slice here
    with pytest.raises(NotADirectoryError):
        _publish(tmp, final, "_slice.json", _Manifest(rows=1))
    assert not tmp.exists()
