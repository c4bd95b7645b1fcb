"""Commit points: a directory appears whole or not at all; crash leftovers are cleaned
(tests/unit/test_listing.py: when)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrec.atomic_fs import publish_dir, remove_leftovers, temp_dir_for, write_text_atomic
from streamrec.listing import list_folder


def test_publish_dir_is_a_rename(tmp_path: Path) -> None:
    final = tmp_path / "out" / "pass"
    tmp = temp_dir_for(final)
    (tmp / "a").write_text("x")
    assert not final.exists()
    publish_dir(tmp, final)
    assert (final / "a").read_text() == "x" and not tmp.exists()
    again = temp_dir_for(final)
    with pytest.raises(OSError):
        publish_dir(again, final)  # never replaces a published directory
    left = list_folder(final.parent, bool).leftovers  # the loser's copy, left behind
    assert remove_leftovers(left, grace_s=0) != []


def test_write_text_atomic_replaces(tmp_path: Path) -> None:
    p = write_text_atomic(tmp_path / "f.json", "1")
    write_text_atomic(p, "2")
    assert p.read_text() == "2"
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]
