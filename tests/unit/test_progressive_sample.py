"""How many rows the progressive scores read, by mode (pure arithmetic)."""

from __future__ import annotations

from trainers.worker.pass_reads import progressive_every, sampled_rows


def test_every_by_mode() -> None:
    assert progressive_every("separate", 1_000_000, 50_000) == 1
    assert progressive_every("in_train", 1_000_000, 50_000) == 0
    assert progressive_every("sample", 1_000_000, 50_000) == 20
    assert progressive_every("sample", 180_001, 50_000) == 4  # about, never fewer rows
    assert progressive_every("sample", 30_000, 50_000) == 1  # a small pass: all of it


def test_sampled_rows_take_each_files_first_row_then_every_kth() -> None:
    assert sampled_rows([10, 9, 1], 3) == 4 + 3 + 1
    assert sampled_rows([10, 9, 1], 1) == 20
