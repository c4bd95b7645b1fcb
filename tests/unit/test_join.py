"""The per-partition join: labels, late and duplicate clicks, replays after a restart."""

from __future__ import annotations

from streaming.join import PartitionJoin

W1, W2 = "202601010000", "202601010010"
T1 = 1767225600000  # start of W1
WINDOW = 300_000


def _join(closed: str | None = None, replay: dict[str, int] | None = None) -> PartitionJoin:
    return PartitionJoin(
        click_join=True, label_window_ms=WINDOW, closed_through=closed, replay_to=replay or {}
    )


def _imp(event_id: str, t: int, offset: int) -> dict:
    return {"event_id": event_id, "event_time_ms": t, "label": 0, "kafka_offset": offset}


def test_clicks_inside_the_window_label_positive() -> None:
    j = _join()
    j.add_impression(W1, _imp("a", T1 + 1000, 0))
    j.add_impression(W1, _imp("b", T1 + 2000, 1))
    j.add_impression(W1, _imp("c", T1 + 3000, 2))
    j.add_click("a", T1 + 1000 + WINDOW, 0)  # exactly at the window edge: counts
    j.add_click("b", T1 + 2000 + WINDOW + 1, 1)  # one ms late
    j.add_click("a", T1 + 5000, 2)  # earlier duplicate: first click wins
    rows = {r["event_id"]: r["label"] for r in j.close(W1).to_pylist()}
    assert rows == {"a": 1, "b": 0, "c": 0}
    # a kept its earliest click but the lowest offset of its two (so a resume re-reads both)
    assert sorted(j.used_click_offsets) == [0, 1]
    c = j.take_counters()
    assert (c.late_clicks, c.duplicate_clicks, c.unmatched_clicks) == (1, 1, 0)
    assert j.closed_through == W1


def test_click_before_its_impression_still_joins() -> None:
    j = _join()
    j.add_click("a", T1 + 9000, 0)
    j.add_impression(W1, _imp("a", T1 + 1000, 5))
    assert j.close(W1).column("label").to_pylist() == [1]
    assert j.lowest_needed("clicks") is None


def test_unmatched_clicks_expire_and_are_counted() -> None:
    j = _join(closed=W1)
    j.add_click("gone", T1 + 1000, 7)
    assert j.lowest_needed("clicks") == 7
    j.expire_unmatched(T1 + 1000 + WINDOW)  # not yet past
    j.expire_unmatched(T1 + 1000 + WINDOW + 1)
    assert j.take_counters().unmatched_clicks == 1
    assert j.lowest_needed("clicks") is None


def test_late_impressions_count_but_replays_do_not() -> None:
    j = _join(closed=W1, replay={"impressions": 10, "clicks": 4})
    j.add_impression(W1, _imp("old", T1, 3))  # replay of a written row: silent
    j.add_impression(W1, _imp("late", T1, 12))  # new and late
    j.add_impression(W2, _imp("new", T1 + 700_000, 9))
    j.add_click("old", T1 + 10, 2)  # replayed click of a written row
    j.expire_unmatched(T1 + 10 * WINDOW)
    assert j.malformed("impressions", 5, "bad_json") is False
    assert j.malformed("impressions", 11, "bad_json") is True
    c = j.take_counters()
    assert (c.late_impressions, c.unmatched_clicks, dict(c.malformed)) == (1, 0, {"bad_json": 1})
    assert j.lowest_needed("impressions") == 9
    assert j.close(W2).column("event_id").to_pylist() == ["new"]


def test_label_in_impression_mode_keeps_labels() -> None:
    j = PartitionJoin(click_join=False, label_window_ms=0, closed_through=None, replay_to={})
    j.add_impression(W1, {**_imp("a", T1, 0), "label": 1})
    assert j.close(W1).column("label").to_pylist() == [1]
