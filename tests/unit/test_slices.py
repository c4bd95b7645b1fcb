"""Publishing a slice or a pass directory: a rename lost to another writer's complete
directory is "someone else won"; any other failure of the rename is raised, never taken
for a lost race (a full or read-only disk would otherwise look like another builder's
slice, and the partition would resume from a slice that does not exist). Assembling a pass
from the slices of its window."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import BaseModel

from streaming.slices import _publish, assemble_pass, write_slice
from streamrec.atomic_fs import temp_dir_for
from streamrec.passes import EventCounts, PassClock, is_complete, pass_dir


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


W0, W1, W2 = "202601010000", "202601010001", "202601010002"


def _slice(root: Path, window: str, partition: int, rows: int) -> None:
    table = pa.table({"event_id": [f"{window}-{i}" for i in range(rows)], "label": [0] * rows})
    fields = {"offsets": {}, "resume_offsets": {}, "consumed_to": {}, "counts": EventCounts()}
    write_slice(root, 1, window, partition, table, 1, fields)


def test_a_pass_assembles_once_each_partition_has_its_slice_or_has_cut_past_it(
    tmp_path: Path,
) -> None:
    """Partition 0's first slice is of W1: its W0 was empty, and W0 must not wait for it (a
    partition's first slice can come before another's earlier one is written)."""
    _slice(tmp_path, W1, 0, 2)
    assert (
        assemble_pass(tmp_path, W0, 2, 1, PassClock(60)) is None
    )  # partition 1 has written nothing
    _slice(tmp_path, W0, 1, 3)
    w0 = assemble_pass(tmp_path, W0, 2, 1, PassClock(60))
    assert w0 is not None and (w0.rows, w0.partitions, len(w0.parts)) == (3, 2, 1)
    assert is_complete(pass_dir(tmp_path, W0))
    # partition 1 has not cut past W1 yet: W1 waits for it, and W2 for both
    assert assemble_pass(tmp_path, W1, 2, 1, PassClock(60)) is None
    _slice(tmp_path, W2, 0, 1)
    assert assemble_pass(tmp_path, W2, 2, 1, PassClock(60)) is None
    _slice(tmp_path, W1, 1, 0)
    w1 = assemble_pass(tmp_path, W1, 2, 1, PassClock(60))
    assert w1 is not None and w1.rows == 2
