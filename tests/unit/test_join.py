"""The per-partition join: labels, late and duplicate clicks, replays after a restart."""

from __future__ import annotations

import pyarrow as pa

from streaming.emit_plan import JoinedLabel
from streaming.join import PartitionJoin
from streamrec.passes import PassClock

W1, W2 = "202601010000", "202601010010"
T1 = 1767225600000  # start of W1
WINDOW = 300_000
TEN_MINUTES = PassClock(600)  # the windows these tests' times fall in


def _join(closed: str | None = None, replay: dict[str, int] | None = None) -> PartitionJoin:
    return PartitionJoin(
        labels=[JoinedLabel("click", "label", WINDOW)],
        closed_through=closed,
        replay_to=replay or {},
        clock=TEN_MINUTES,
    )


def _imp(event_id: str, t: int, offset: int) -> dict:
    return {"event_id": event_id, "event_time_ms": t, "label": 0, "kafka_offset": offset}


def test_clicks_inside_the_window_label_positive() -> None:
    j = _join()
    j.add_impression(W1, _imp("a", T1 + 1000, 0))
    j.add_impression(W1, _imp("b", T1 + 2000, 1))
    j.add_impression(W1, _imp("c", T1 + 3000, 2))
    j.add_label("click", "a", T1 + 1000 + WINDOW, 0)  # exactly at the window edge: counts
    j.add_label("click", "b", T1 + 2000 + WINDOW + 1, 1)  # one ms late
    j.add_label("click", "a", T1 + 5000, 2)  # earlier duplicate: first click wins
    rows = {r["event_id"]: r["label"] for r in j.close(W1).to_pylist()}
    assert rows == {"a": 1, "b": 0, "c": 0}
    # a kept its earliest click but the lowest offset of its two (so a resume re-reads both)
    assert sorted(j.used_offsets["click"]) == [0, 1]
    c = j.take_counters().of("click")
    assert (c.late, c.duplicate, c.unmatched) == (1, 1, 0)
    assert j.closed_through == W1


def test_click_before_its_impression_still_joins() -> None:
    j = _join()
    j.add_label("click", "a", T1 + 9000, 0)
    j.add_impression(W1, _imp("a", T1 + 1000, 5))
    assert j.close(W1).column("label").to_pylist() == [1]
    assert j.lowest_needed("click") is None


def test_unmatched_clicks_expire_and_are_counted() -> None:
    j = _join(closed=W1)
    j.add_label("click", "gone", T1 + 1000, 7)
    assert j.lowest_needed("click") == 7
    j.expire_unmatched(T1 + 1000 + WINDOW)  # not yet past
    j.expire_unmatched(T1 + 1000 + WINDOW + 1)
    assert j.take_counters().of("click").unmatched == 1
    assert j.lowest_needed("click") is None


def test_late_impressions_count_but_replays_do_not() -> None:
    j = _join(closed=W1, replay={"impressions": 10, "click": 4})
    j.add_impression(W1, _imp("old", T1, 3))  # replay of a written row: silent
    j.add_impression(W1, _imp("late", T1, 12))  # new and late
    j.add_impression(W2, _imp("new", T1 + 700_000, 9))
    j.add_label("click", "old", T1 + 10, 2)  # replayed click of a written row
    j.expire_unmatched(T1 + 10 * WINDOW)
    assert j.malformed("impressions", 5, "bad_json") is False
    assert j.malformed("impressions", 11, "bad_json") is True
    c = j.take_counters()
    assert (c.late_impressions, c.of("click").unmatched, dict(c.malformed)) == (
        1,
        0,
        {"bad_json": 1},
    )
    assert j.lowest_needed("impressions") == 9
    assert j.close(W2).column("event_id").to_pylist() == ["new"]


def test_label_in_impression_mode_keeps_labels() -> None:
    j = PartitionJoin(labels=[], closed_through=None, replay_to={}, clock=TEN_MINUTES)
    j.add_impression(W1, {**_imp("a", T1, 0), "label": 1})
    assert j.close(W1).column("label").to_pylist() == [1]


def test_a_step_takes_the_rows_held_and_a_replay_below_it_is_skipped() -> None:
    j = PartitionJoin(labels=[], closed_through=None, replay_to={}, clock=TEN_MINUTES)
    j.add_impression(W1, _imp("a", T1, 0))
    j.add_impression(W2, _imp("next", T1 + 600_000, 1))  # the next window's, held
    j.add_impression(W1, _imp("b", T1 + 10, 2))
    assert j.take_step(W1).column("event_id").to_pylist() == ["a", "b"]
    assert j.take_step(W1) is None
    assert j.lowest_needed("impressions") == 1  # a resume after the step re-reads from 1
    j.add_impression(W1, _imp("a", T1, 5))  # the same impression again: still one
    j.add_impression(W1, _imp("c", T1 + 20, 6))
    assert j.close(W1).column("event_id").to_pylist() == ["c"]
    # a restart after the step: its window's rows below the step's read point (3) are in
    # the step; the next window's are not
    j = PartitionJoin(
        labels=[], closed_through=None, replay_to={"impressions": 3}, clock=TEN_MINUTES
    )
    j.step_consumed = {W1: 3}
    for window, row in [(W2, _imp("next", T1 + 600_000, 1)), (W1, _imp("b", T1 + 10, 2))]:
        j.add_impression(window, row)
    j.add_impressions([W1, W1], pa.Table.from_pylist([_imp("c", T1 + 20, 6), _imp("d", T1, 7)]))
    assert j.close(W1).column("event_id").to_pylist() == ["c", "d"]
    assert j.close(W2).column("event_id").to_pylist() == ["next"]
    assert j.step_consumed == {}


CONV_WINDOW = 3_600_000
CLICK = JoinedLabel("click", "label", WINDOW)


def _two(keep: bool = False, strays: bool = True, replay: dict[str, int] | None = None):
    conversion = JoinedLabel(
        "conversion",
        "label_conversion",
        CONV_WINDOW,
        requires="click",
        keep_unattributed=keep,
        dead_letter_strays=strays,
    )
    return PartitionJoin(
        labels=[CLICK, conversion], closed_through=None, replay_to=replay or {}, clock=TEN_MINUTES
    )


def _imp2(event_id: str, t: int, offset: int) -> dict:
    return {**_imp(event_id, t, offset), "label_conversion": 0}


def test_each_label_joins_within_its_own_window() -> None:
    j = _two()
    for i, name in enumerate("abcd"):
        j.add_impression(W1, _imp2(name, T1 + i, i))
    j.add_label("click", "a", T1 + 10, 0)
    j.add_label("conversion", "a", T1 + CONV_WINDOW, 0)  # at its window's edge: counts
    j.add_label("click", "b", T1 + 1 + 10, 1)
    j.add_label("conversion", "b", T1 + 1 + CONV_WINDOW + 1, 1)  # one ms late
    j.add_label("click", "c", T1 + 2 + WINDOW + 1, 2)  # a late click ...
    j.add_label("conversion", "c", T1 + 2 + 60_000, 2)  # ... so its conversion is unattributed
    j.add_label("conversion", "d", T1 + 3 + 60_000, 3)  # a conversion never clicked
    j.add_label("conversion", "d", T1 + 3 + 90_000, 4)  # and repeated
    rows = {r["event_id"]: (r["label"], r["label_conversion"]) for r in j.close(W1).to_pylist()}
    assert rows == {"a": (1, 1), "b": (1, 0), "c": (0, 0), "d": (0, 0)}
    counters = j.take_counters()
    assert vars(counters.of("click")) == vars(counters.of("click")) | {"late": 1}
    conv = counters.of("conversion")
    assert (conv.late, conv.duplicate, conv.unattributed, conv.unmatched) == (1, 1, 2, 0)
    reasons = sorted((s.reason, s.event_id, s.offset) for s in j.take_strays())
    # the click's stray is not dead-lettered (its label counts strays only)
    assert reasons == [
        ("duplicate", "d", 4),
        ("late", "b", 1),
        ("unattributed", "c", 2),
        ("unattributed", "d", 3),
    ]
    assert j.take_strays() == []


def test_unattributed_conversions_can_be_kept() -> None:
    j = _two(keep=True)
    j.add_impression(W1, _imp2("a", T1, 0))
    j.add_label("conversion", "a", T1 + 5, 0)
    assert j.close(W1).to_pylist()[0]["label_conversion"] == 1
    assert j.take_counters().of("conversion").unattributed == 1
    assert j.take_strays() == []


def test_unmatched_label_events_expire_by_their_own_window() -> None:
    j = _two()
    j.add_label("conversion", "gone", T1, 7)
    j.expire_unmatched(T1 + WINDOW + 1)  # past the click's window, not the conversion's
    assert j.lowest_needed("conversion") == 7
    j.expire_unmatched(T1 + CONV_WINDOW + 1)
    assert j.take_counters().of("conversion").unmatched == 1
    assert [(s.reason, s.offset) for s in j.take_strays()] == [("unmatched", 7)]


def test_a_replay_counts_what_no_slice_counted_yet() -> None:
    j = _two(replay={"impressions": 5, "click": 5, "conversion": 5})
    j.add_impression(W1, _imp2("a", T1, 6))
    j.add_label("conversion", "a", T1 + 5, 2)  # read before the restart; its row still pending
    j.add_label("conversion", "a", T1 + 6, 4)  # a duplicate counted before the restart
    j.add_label("conversion", "zz", T1, 3)  # unmatched, read before too
    j.expire_unmatched(T1 + 2 * CONV_WINDOW)
    # the row is labelled as it would have been, and its fate, decided only now, counted
    assert j.close(W1).to_pylist()[0]["label_conversion"] == 0
    conv = j.take_counters().of("conversion")
    assert (conv.unattributed, conv.duplicate, conv.unmatched) == (1, 0, 0)
    assert [(s.reason, s.offset) for s in j.take_strays()] == [("unattributed", 2)]


def test_rows_of_later_windows_are_counted_as_waiting() -> None:
    j = _two()
    j.add_impression(W1, _imp2("a", T1, 0))
    j.add_impression(W2, _imp2("b", T1 + 600_000, 1))
    j.add_impression(W2, _imp2("c", T1 + 600_001, 2))
    assert j.waiting() == 3
    j.close(W1)
    assert j.waiting() == 2


def test_a_window_whose_fresh_rows_used_no_label_event_names_no_offsets() -> None:
    """An at_once label's observed rows are all negatives: a window closed before any click
    came used no click offset, and says none (the builder crashed on the empty range)."""
    j = PartitionJoin(
        labels=[JoinedLabel("click", "label", WINDOW, emit="at_once")],
        closed_through=None,
        replay_to={},
        clock=TEN_MINUTES,
    )
    j.add_impression(W1, _imp("a", T1 + 1000, 0))
    table = j.close(W1)
    assert table is not None and table.num_rows == 1
    assert all(j.used_offsets.values()), j.used_offsets
