"""The pass contract: id grammar, windows and directories."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from streamrec.errors import ContractError
from streamrec.passes import (
    PassClock,
    complete_passes,
    is_pass_keyed,
    parse_pass_id,
    pass_dir,
    pass_state,
    read_manifest,
    slice_dir,
)


def test_event_time_maps_to_window_start() -> None:
    t = int(datetime(2026, 1, 1, 0, 17, 59, tzinfo=UTC).timestamp() * 1000)
    assert PassClock(600).id_at(t) == "202601010010"
    assert PassClock(3600).id_at(t) == "202601010000"
    start, end = PassClock(600).window("202601010010")
    assert start <= t < end and end - start == 600_000


def test_ids_roundtrip_and_step() -> None:
    clock = PassClock(600)
    assert clock.id_of(parse_pass_id("202612312350")) == "202612312350"
    assert clock.next("202612312350") == "202701010000"
    assert clock.closes_day("202612312350") and not clock.closes_day("202612312340")


def test_passes_under_a_minute_have_seconds_in_their_ids_and_sort_with_minute_ones() -> None:
    clock = PassClock(15)
    t = int(datetime(2026, 1, 1, 23, 59, 47, tzinfo=UTC).timestamp() * 1000)
    assert clock.id_at(t) == "20260101235945"
    assert clock.next("20260101235945") == "20260102000000"  # the day's last window
    assert clock.closes_day("20260101235945") and not clock.closes_day("20260101235930")
    assert clock.window("20260101235945")[1] - clock.window("20260101235945")[0] == 15_000
    assert clock.floor(datetime(2026, 1, 1, 9, 0, 29, tzinfo=UTC)).second == 15
    assert is_pass_keyed("20260101235945-delta") and is_pass_keyed("202601012359-delta")
    # a pipeline whose passes went from a minute to 15 s keeps its history in start order
    ids = ["202601010900", "202601010901", "20260101090115", "20260101090100", "202601010859"]
    starts = [parse_pass_id(i) for i in sorted(ids)]
    assert starts == sorted(starts)


@pytest.mark.parametrize("seconds", [0, 7, 1000, 7 * 60, 86_400 * 2])
def test_a_window_that_does_not_divide_a_day_is_refused(seconds: int) -> None:
    with pytest.raises(ValueError, match="does not divide a day"):
        PassClock(seconds)


@pytest.mark.parametrize(
    "bad", ["2026010100", "20260101000a", "202613010000", "2026010100006", "../etc/passwd"]
)
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


def test_complete_passes_since_an_id_are_the_later_ones_of_every_day(tmp_path: Path) -> None:
    ids = ["202601010000", "20260101000015", "202601010001", "202601012359", "202601020000"]
    for pass_id in ids:
        _complete(tmp_path, pass_id)
    pass_dir(tmp_path, "202601020001").mkdir(parents=True)  # being written: not complete
    assert complete_passes(tmp_path) == ids
    for since in [*ids, "202601010002", "202601020001", "202512310000", "202601030000"]:
        assert complete_passes(tmp_path, since) == [p for p in ids if p >= since], since


def test_window_floor_rounds_down_to_a_window_start() -> None:
    moment = datetime(2026, 11, 23, 9, 7, 31, tzinfo=UTC)
    assert PassClock(300).floor(moment) == datetime(2026, 11, 23, 9, 5, tzinfo=UTC)
    assert PassClock(3600).floor(moment) == datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
