"""Labels written before their window closes (``schema.labels[].emit``): the emit plan, the
rows each policy writes, and exactly once per (impression, row kind) across restarts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from streaming.emit_plan import JoinedLabel, emit_plan
from streaming.join import IMPRESSIONS, PartitionJoin
from streaming.join_spill import SpillSettings, SpillStore
from streamrec.config import ELAPSED_COLUMN, delay_column
from streamrec.passes import PassClock, RowKind

T0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC
MINUTE = 60_000
CLOCK = PassClock(60)  # one-minute windows
CLICK = JoinedLabel("click", "label", 2 * MINUTE, emit="at_once")
CONVERSION = JoinedLabel(
    "conversion", "label_conversion", 10 * MINUTE, emit="after_wait", wait_ms=MINUTE
)
COLUMNS = {"click": "label", "conversion": "label_conversion"}


def _join(labels: list[JoinedLabel], closed: str | None = None, **kw) -> PartitionJoin:
    columns = {x.kind: x.column for x in labels}
    return PartitionJoin(
        labels=labels,
        closed_through=closed,
        replay_to=kw.pop("replay", {}),
        plan=emit_plan(labels, columns),
        clock=CLOCK,
        **kw,
    )


def _imp(event_id: str, t: int, offset: int, labels=COLUMNS) -> dict:
    row = {"event_id": event_id, "event_time_ms": t, "kafka_offset": offset}
    return row | dict.fromkeys(labels.values(), 0)


def _window(t: int) -> str:
    return CLOCK.id_at(t)


def test_the_plan_groups_labels_by_when_their_rows_are_written() -> None:
    plan = emit_plan([CLICK, CONVERSION], COLUMNS)
    assert plan.groups == ((0, ("click",)), (MINUTE, ("conversion",)))
    assert (plan.cut_delay_ms, plan.mature_ms, plan.delayed) == (0, 10 * MINUTE, True)
    # after_window labels share one row at the longest such window, as before policies
    click = JoinedLabel("click", "label", 2 * MINUTE)
    conversion = JoinedLabel("conversion", "label_conversion", 10 * MINUTE)
    plan = emit_plan([click, conversion], COLUMNS)
    assert plan.groups == ((10 * MINUTE, ("click", "conversion")),) and not plan.delayed
    assert plan.row_fields() == []
    # a label the impression carries rides in the earliest row
    carried = {"click": "label", "conversion": "label_conversion"}
    plan = emit_plan([CONVERSION], carried)
    assert plan.groups == ((MINUTE, ("click", "conversion")),)
    names = [f.name for f in plan.row_fields()]
    assert names == ["kind_click", "kind_conversion", "delay_ms_conversion", ELAPSED_COLUMN]


def _by_id(table: pa.Table | None) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for row in table.to_pylist() if table is not None else []:
        rows.setdefault(row["event_id"], []).append(row)
    return rows


def test_at_once_writes_a_negative_at_once_and_a_duplicate_when_the_label_comes() -> None:
    j = _join([CLICK])
    j.add_impression(_window(T0), _imp("a", T0 + 1000, 0, {"click": "label"}))
    j.add_impression(_window(T0), _imp("b", T0 + 2000, 1, {"click": "label"}))
    j.add_label("click", "a", T0 + 11_000, 0)  # within the same minute: a duplicate here
    j.add_label("click", "b", T0 + 70_000, 1)  # next minute: its duplicate is the next pass's
    rows = _by_id(j.close(_window(T0)))
    kinds = {e: sorted((r["kind_click"], r["label"]) for r in rs) for e, rs in rows.items()}
    assert kinds == {
        "a": [(RowKind.OBSERVED, 0), (RowKind.DUPLICATE, 1)],
        "b": [(RowKind.OBSERVED, 0)],
    }
    duplicate = next(r for r in rows["a"] if r["kind_click"] == RowKind.DUPLICATE)
    assert duplicate[ELAPSED_COLUMN] == duplicate[delay_column("click")] == 10_000
    assert j.open == {"click": 2} and j.matured is None
    rows = _by_id(j.close(CLOCK.next(_window(T0))))
    assert [(r["kind_click"], r["label"], r[ELAPSED_COLUMN]) for r in rows["b"]] == [
        (RowKind.DUPLICATE, 1, 68_000)
    ]
    j.close(CLOCK.next(CLOCK.next(_window(T0))))  # 00:03: both matured (2 min)
    matured = _by_id(j.matured)
    assert {e: (r[0]["label"], r[0]["kind_click"]) for e, r in matured.items()} == {
        "a": (1, RowKind.MATURED),
        "b": (1, RowKind.MATURED),
    }
    assert (
        j.waiting() == 0
        and j.lowest_needed("click") is None
        and j.lowest_needed(IMPRESSIONS) is None
    )


def test_after_wait_writes_the_label_as_of_the_wait_and_later_positives_as_duplicates() -> None:
    conversion = JoinedLabel("conversion", "label", 10 * MINUTE, emit="after_wait", wait_ms=MINUTE)
    j = _join([conversion])
    cols = {"conversion": "label"}
    for i, name in enumerate("abc"):
        j.add_impression(_window(T0), _imp(name, T0 + i, i, cols))
    j.add_label("conversion", "a", T0 + 30_000, 0)  # within the wait: the observed row says 1
    j.add_label("conversion", "b", T0 + 1 + 5 * MINUTE, 1)  # after it: a duplicate then
    j.add_label("conversion", "c", T0 + 2 + 11 * MINUTE, 2)  # after the window: never
    w = _window(T0)
    # the observed rows wait a minute: the pass of 00:00 is cut a minute after its end
    observed = _by_id(j.close(w))
    assert {
        e: (r[0]["label"], r[0]["kind_conversion"], r[0][ELAPSED_COLUMN])
        for e, r in observed.items()
    } == {
        "a": (1, RowKind.OBSERVED, MINUTE),
        "b": (0, RowKind.OBSERVED, MINUTE),
        "c": (0, RowKind.OBSERVED, MINUTE),
    }
    written: Counter[tuple] = Counter()
    for _ in range(11):
        w = CLOCK.next(w)
        for e, rs in _by_id(j.close(w)).items():
            written.update((e, r["kind_conversion"], r["label"], w) for r in rs)
        for e, rs in _by_id(j.matured).items():
            written.update((e, r["kind_conversion"], r["label"], "matured") for r in rs)
    assert written == Counter(
        {
            ("b", RowKind.DUPLICATE, 1, "202601010004"): 1,  # at 00:05, a minute early
            ("a", RowKind.MATURED, 1, "matured"): 1,
            ("b", RowKind.MATURED, 1, "matured"): 1,
            ("c", RowKind.MATURED, 0, "matured"): 1,
        }
    )
    assert j.take_counters().of("conversion").late == 1  # c's, once its last row is written


def test_a_conversion_duplicate_needs_its_click_as_of_then() -> None:
    click = JoinedLabel("click", "label", 2 * MINUTE)
    conversion = JoinedLabel(
        "conversion", "label_conversion", 10 * MINUTE, requires="click", emit="at_once"
    )
    j = _join([click, conversion])
    j.add_impression(_window(T0), _imp("a", T0, 0))
    j.add_impression(_window(T0), _imp("b", T0 + 1, 1))
    j.add_label("click", "a", T0 + 5_000, 0)
    j.add_label("conversion", "a", T0 + 20_000, 0)  # clicked before: a duplicate
    j.add_label("conversion", "b", T0 + 20_000, 1)  # never clicked: none, and unattributed
    rows = j.close(_window(T0))
    duplicates = [
        r["event_id"] for r in rows.to_pylist() if r["kind_conversion"] == RowKind.DUPLICATE
    ]
    assert duplicates == ["a"]
    w = _window(T0)
    for _ in range(10):
        w = CLOCK.next(w)
        j.close(w)
    matured = {r["event_id"]: (r["label"], r["label_conversion"]) for r in j.matured.to_pylist()}
    assert matured == {"a": (1, 1), "b": (0, 0)}
    assert j.take_counters().of("conversion").unattributed == 1
    assert [(s.reason, s.event_id) for s in j.take_strays()] == [("unattributed", "b")]


def test_a_label_read_after_its_row_was_written_is_late_but_matures() -> None:
    j = _join([CLICK])
    j.add_impression(_window(T0), _imp("a", T0, 0, {"click": "label"}))
    j.close(_window(T0))
    j.add_label("click", "a", T0 + 10_000, 0)  # its duplicate was due in the closed 00:00
    assert j.take_counters().of("click").late == 1
    w, matured = _window(T0), []
    for _ in range(3):
        w = CLOCK.next(w)
        assert j.close(w) is None
        matured += j.matured.to_pylist() if j.matured is not None else []
    assert [(r["event_id"], r["label"]) for r in matured] == [("a", 1)]


# -- exactly once across restarts -------------------------------------------------------


@dataclass
class _Stream:
    """Impressions and their label events in event-time order, with per-topic offsets."""

    topics: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # (time, event_id)
    impressions: dict[str, int] = field(default_factory=dict)  # event_id -> time
    labels: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> id -> time


def _stream(seed: int, n: int = 300) -> _Stream:
    rng = np.random.default_rng(seed)
    stream = _Stream()
    times = np.sort(T0 + rng.integers(0, 8 * MINUTE, n))
    stream.impressions = {f"i{k}": int(t) for k, t in enumerate(times)}
    stream.topics[IMPRESSIONS] = [(int(t), f"i{k}") for k, t in enumerate(times)]
    for label, share, scale in ((CLICK, 0.3, 60_000), (CONVERSION, 0.2, 180_000)):
        mine = {
            e: t + 1 + int(rng.exponential(scale))
            for e, t in stream.impressions.items()
            if rng.random() < share
        }
        stream.labels[label.kind] = mine
        stream.topics[label.kind] = sorted((t, e) for e, t in mine.items())
    return stream


def _expected(stream: _Stream) -> Counter[tuple]:
    """(event_id, kind_click, kind_conversion, label, label_conversion, pass) of every row
    the plan implies, matured rows' pass "matured@<pass>"."""
    rows: Counter[tuple] = Counter()
    for e, t in stream.impressions.items():
        click = stream.labels["click"].get(e)
        conv = stream.labels["conversion"].get(e)
        click_ok = click is not None and click - t <= CLICK.window_ms
        conv_ok = conv is not None and conv - t <= CONVERSION.window_ms
        rows[(e, 1, 0, 0, 0, _window(t))] += 1
        rows[(e, 0, 1, 0, int(conv_ok and conv - t <= MINUTE), _window(t + MINUTE))] += 1
        if click_ok:
            rows[(e, 2, 0, 1, 0, _window(click))] += 1
        if conv_ok and conv - t > MINUTE:
            rows[(e, 0, 2, 0, 1, _window(conv))] += 1
        matured = _window(t + CONVERSION.window_ms)
        rows[(e, 3, 3, int(click_ok), int(conv_ok), f"matured@{matured}")] += 1
    return rows


@dataclass
class _Slice:
    window: str
    resume: dict[str, int]
    consumed: dict[str, int]


def _run(
    stream: _Stream, kill_every: int, seed: int, spill: Path | None = None
) -> tuple[Counter[tuple], int, Counter[str]]:
    """Feed the stream in event-time order, cutting each window once its horizon passed,
    killed (state dropped, rebuilt from the newest slice) about every ``kill_every`` steps.
    With ``spill``, the join checkpoints to a spill store there after each cut (unless
    killed first) and now and then between cuts, and a restart resumes from the store
    where it can; the restarts are counted by how they resumed."""
    rng = np.random.default_rng(seed)
    labels = [CLICK, CONVERSION]
    slices: dict[str, _Slice] = {}
    written: Counter[tuple] = Counter()
    kills, resumed = 0, Counter[str]()
    settings = SpillSettings(spill, 64, "test") if spill else None
    j: PartitionJoin | None = None

    def fresh() -> tuple[PartitionJoin, dict[str, int]]:
        if j is not None:
            j.close_store()  # the killed builder's process is gone
        newest = slices[max(slices)] if slices else None
        join = _join(
            labels,
            closed=newest.window if newest else None,
            replay=dict(newest.consumed) if newest else {},
            cut_consumed=lambda w: slices[w].consumed[IMPRESSIONS] if w in slices else None,
            spill=settings,
        )
        if (restored := join.restore()) is not None:
            resumed["spill"] += 1
            return join, dict(restored[0])
        resumed["replay"] += 1
        return join, dict(newest.resume) if newest else dict.fromkeys(stream.topics, 0)

    def cut(j: PartitionJoin, position: dict[str, int], window: str) -> None:
        rows = (j.close(window) or pa.table({})).to_pylist()
        known = [r["event_time_ms"] + r[ELAPSED_COLUMN] for r in rows]
        assert known == sorted(known)  # in the order they became known, as they train
        for r in rows:
            assert _window(r["event_time_ms"] + r[ELAPSED_COLUMN]) == window
            key = (r["kind_click"], r["kind_conversion"], r["label"], r["label_conversion"])
            written[(r["event_id"], *key, window)] += 1
        for r in (j.matured or pa.table({})).to_pylist():
            key = (r["kind_click"], r["kind_conversion"], r["label"], r["label_conversion"])
            written[(r["event_id"], *key, f"matured@{window}")] += 1
        resume = {}
        for topic, at in position.items():
            lowest = j.lowest_needed(topic)
            resume[topic] = at if lowest is None else min(lowest, at)
        slices[window] = _Slice(window, resume, dict(position))

    j, position = fresh()
    end = T0 + 8 * MINUTE + CONVERSION.window_ms + 3 * MINUTE
    while True:
        heads = [
            (stream.topics[k][position[k]][0], k)
            for k in stream.topics
            if position[k] < len(stream.topics[k])
        ]
        now = min(heads)[0] if heads else end
        next_window = CLOCK.next(j.closed_through) if j.closed_through else _window(T0)
        if CLOCK.window(next_window)[1] <= now:  # cut delay 0: the horizon is the end
            if rng.random() < 1 / (2 * kill_every):  # killed while writing the slice
                j.close(next_window)
                j, position = fresh()
                kills += 1
                continue
            cut(j, position, next_window)
            if rng.random() < 1 / kill_every:
                j, position = fresh()
                kills += 1
            elif settings is not None:
                j.checkpoint(dict(position), {})
            continue
        if not heads:
            break
        _, kind = min(heads)
        t, event_id = stream.topics[kind][position[kind]]
        offset = position[kind]
        position[kind] += 1
        if kind == IMPRESSIONS:
            row = _imp(event_id, t, offset)
            j.add_impressions([_window(t)], pa.Table.from_pylist([row]))
        else:
            j.add_label(kind, event_id, t, offset)
        if rng.random() < 1 / 400:  # killed between two cuts: the reads since are lost
            j, position = fresh()
            kills += 1
        elif settings is not None and rng.random() < 1 / 50:  # past the memory budget
            j.checkpoint(dict(position), {})
    if j is not None:
        j.close_store()
    return written, kills, resumed


@pytest.mark.parametrize("seed", range(6))
def test_every_row_is_written_once_in_its_pass_however_often_the_builder_dies(seed: int) -> None:
    stream = _stream(seed)
    written, kills, _ = _run(stream, kill_every=3, seed=seed)
    assert kills >= 3
    expected = _expected(stream)
    assert written == expected, (
        f"missing {sorted(expected - written)[:5]}, extra {sorted(written - expected)[:5]}"
    )


@pytest.mark.parametrize("seed", range(6))
def test_a_spilled_join_resumes_from_its_store_and_writes_every_row_once(
    seed: int, tmp_path: Path
) -> None:
    """The same stream with the join's state checkpointed to its spill store: restarts
    resume from the store where the newest slice's cut was checkpointed, replay the topics
    where it was not (killed between a cut and its checkpoint), and the rows are the
    generator's either way."""
    stream = _stream(seed)
    written, kills, resumed = _run(stream, kill_every=3, seed=seed, spill=tmp_path / "spill")
    assert kills >= 3 and resumed["spill"] >= 1 and resumed["replay"] >= 2, resumed
    expected = _expected(stream)
    assert written == expected, (
        f"missing {sorted(expected - written)[:5]}, extra {sorted(written - expected)[:5]}"
    )


def _after_window_rows(stream: _Stream, spill: Path | None) -> tuple[Counter[tuple], dict]:
    """Every row and the counters of an after_window join fed the stream in time order, its
    state checkpointed every 25 events when it spills."""
    labels = [
        JoinedLabel("click", "label", 2 * MINUTE),
        JoinedLabel("conversion", "label_conversion", 10 * MINUTE, requires="click"),
    ]
    j = _join(labels, spill=SpillSettings(spill, 64, "test") if spill else None)
    events = sorted((t, k, e) for k, topic in stream.topics.items() for t, e in topic)
    rows: Counter[tuple] = Counter()
    counts: Counter[str] = Counter()
    offsets: Counter[str] = Counter()
    window = _window(T0)
    for step, (t, kind, event_id) in enumerate([*events, (T0 + 30 * MINUTE, "", "")]):
        while CLOCK.window(window)[1] + j.plan.cut_delay_ms <= t:
            for r in (j.close(window) or pa.table({})).to_pylist():
                rows[(r["event_id"], r["label"], r["label_conversion"], window)] += 1
            for kind_, c in j.take_counters().labels.items():
                counts.update({f"{kind_}.{k}": v for k, v in vars(c).items()})
            window = CLOCK.next(window)
        if not kind:
            break
        if kind == IMPRESSIONS:
            j.add_impressions([_window(t)], pa.Table.from_pylist([_imp(event_id, t, step)]))
        else:
            j.add_label(kind, event_id, t, offsets[kind])
        offsets[kind] += 1
        if spill and step % 25 == 24:
            j.checkpoint(dict(offsets), {})
    assert j.waiting() == 0
    j.close_store()
    return rows, dict(counts)


@pytest.mark.parametrize("seed", range(3))
def test_an_after_window_join_writes_the_same_rows_spilled(seed: int, tmp_path: Path) -> None:
    """The default policy's rows (every label final, a conversion requiring its click) and
    counts are the same whether the held state stays in memory or is spilled as it grows."""
    stream = _stream(seed)
    in_memory = _after_window_rows(stream, None)
    assert sum(in_memory[0].values()) == len(stream.impressions)
    counts = in_memory[1]
    assert counts["click.late"] and counts["conversion.unattributed"], counts
    assert _after_window_rows(stream, tmp_path / "spill") == in_memory


def test_the_spill_check_fails_when_a_cut_leaves_the_store_clean(tmp_path: Path) -> None:
    """A store a cut changed but left marked clean resumes a restart from a checkpoint
    whose rows were written and deleted since: the check above sees rows missing."""
    stream = _stream(0)
    original = SpillStore._mark_dirty
    SpillStore._mark_dirty = lambda self: None  # type: ignore[method-assign]
    try:
        written, _, resumed = _run(stream, kill_every=3, seed=0, spill=tmp_path / "spill")
    finally:
        SpillStore._mark_dirty = original  # type: ignore[method-assign]
    assert resumed["spill"] > 1 and written != _expected(stream)


def test_the_restart_check_fails_without_the_replay_horizon() -> None:
    """The same run with the replay forgetting the newest slice's horizon writes rows twice:
    the check above can fail."""
    stream = _stream(0)
    original = PartitionJoin.__init__

    def forgetful(self, **kw) -> None:
        original(self, **kw)
        self.horizon_ms = None

    PartitionJoin.__init__ = forgetful  # type: ignore[method-assign]
    try:
        written, kills, _ = _run(stream, kill_every=3, seed=0)
    finally:
        PartitionJoin.__init__ = original  # type: ignore[method-assign]
    assert kills and written != _expected(stream)


def test_a_replayed_impression_that_was_late_stays_dropped() -> None:
    """After a restart, an impression of a closed window is held again only if it was read
    before that window was cut (its slice's ``consumed_to`` says so): one that was late
    when first read wrote no row then and writes none now."""
    w = _window(T0)
    j = _join(
        [CLICK],
        closed=w,
        replay={IMPRESSIONS: 10},
        cut_consumed=lambda window: 5 if window == w else None,
    )
    j.add_impressions(
        [w, w],
        pa.Table.from_pylist(
            [
                _imp("held", T0 + 1, 3, {"click": "label"}),
                _imp("late", T0 + 2, 7, {"click": "label"}),
            ]
        ),
    )
    assert j.waiting() == 1 and j.lowest_needed(IMPRESSIONS) == 3
    assert j.take_counters().late_impressions == 0  # counted when first read
