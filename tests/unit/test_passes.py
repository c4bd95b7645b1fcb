"""The pass contract: id grammar, windows and directories."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from streamrec.errors import ContractError
from streamrec.passes import (
    compose_pass_id,
    next_pass_id,
    parse_pass_id,
    pass_dir,
    pass_id_at,
    pass_state,
    read_manifest,
    slice_dir,
    window_floor,
    window_ms,
)


def test_event_time_maps_to_window_start() -> None:
    t = int(datetime(2026, 1, 1, 0, 17, 59, tzinfo=UTC).timestamp() * 1000)
    assert compose_pass_id(t, 10) == "202601010010"
    assert compose_pass_id(t, 60) == "202601010000"
    start, end = window_ms("202601010010", 10)
    assert start <= t < end and end - start == 600_000


def test_ids_roundtrip_and_step() -> None:
    assert pass_id_at(parse_pass_id("202612312350")) == "202612312350"
    assert next_pass_id("202612312350", 10) == "202701010000"


@pytest.mark.parametrize("bad", ["2026010100", "20260101000a", "202613010000", "../etc/passwd"])
def test_bad_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ContractError):
        parse_pass_id(bad)


def test_layout_and_incomplete_pass(tmp_path: Path) -> None:
    d = pass_dir(tmp_path, "202601010010")
    assert d == tmp_path / "passes" / "20260101" / "202601010010"
    d.mkdir(parents=True)
    with pytest.raises(ContractError, match="not complete"):
        read_manifest(d)


def _complete(root: Path, pass_id: str) -> None:
    d = pass_dir(root, pass_id)
    d.mkdir(parents=True)
    (d / "_SUCCESS").touch()


def test_pass_state_tells_waiting_from_never(tmp_path: Path) -> None:
    state, why = pass_state(tmp_path, "202601010000")
    assert state == "pending" and "none yet" in why and "_SUCCESS" in why
    _complete(tmp_path, "202601010010")
    assert pass_state(tmp_path, "202601010010")[0] == "complete"
    # an earlier window nobody wrote a slice of: before the stream began
    state, why = pass_state(tmp_path, "202601010000")
    assert state == "never" and "202601010010" in why
    # a window a partition is still writing waits, whatever is complete after it
    slice_dir(tmp_path, "202601010005", 0).parent.mkdir(parents=True)
    assert pass_state(tmp_path, "202601010005")[0] == "pending"
    # after the newest complete pass: the stream has not got there yet
    assert pass_state(tmp_path, "202601010020")[0] == "pending"


def test_window_floor_rounds_down_to_a_window_start() -> None:
    moment = datetime(2026, 11, 23, 9, 7, 31, tzinfo=UTC)
    assert window_floor(moment, 5) == datetime(2026, 11, 23, 9, 5, tzinfo=UTC)
    assert window_floor(moment, 60) == datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
