"""The window cutter (``streaming.windows``) with the per-partition join it cuts: the
watermark, which windows a watermark completes, and, for any interleaving of partitions,
late and duplicate impressions (hypothesis), every event in exactly one slice, each window
cut once per partition, nothing cut before its watermark and nothing within the allowed
lateness dropped. The driver below does what ``PassBuilder`` does between a poll and a
slice write, without Kafka or files."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from streaming.join import PartitionJoin
from streaming.windows import WindowCutter, watermark_ms
from streamrec.passes import PassClock

T0 = 1767225600000  # 2026-01-01 00:00 UTC
MINUTE = 60_000
CLOCK = PassClock(60)  # one-minute windows
IMP, CLK = "impressions", "clicks"


def _id(minutes: int) -> str:
    return CLOCK.id_at(T0 + minutes * MINUTE)


def test_the_watermark_is_the_oldest_active_topics_newest_time_less_the_lateness() -> None:
    topics = (IMP, CLK)
    newest = {IMP: T0 + 5 * MINUTE, CLK: T0 + 3 * MINUTE}
    assert watermark_ms(newest, topics, set(), 0, 1000) == T0 + 3 * MINUTE - 1000
    # an idle topic is left out; a topic that sent nothing yet holds the partition at 0
    assert watermark_ms(newest, topics, {CLK}, 0, 1000) == T0 + 5 * MINUTE - 1000
    assert watermark_ms({IMP: T0}, topics, set(), T0, 0) == 0
    # every topic idle: the newest time of any partition stands in
    assert watermark_ms(newest, topics, {IMP, CLK}, T0 + 9 * MINUTE, 0) == T0 + 9 * MINUTE


def test_complete_windows_are_cut_in_order_with_the_empty_ones_between() -> None:
    cutter = WindowCutter(CLOCK)
    candidates = {_id(0), _id(3), _id(4)}
    # a window is complete once its end is at or below the watermark, not a millisecond before
    assert cutter.to_cut(candidates, None, T0 + MINUTE - 1) == []
    assert cutter.to_cut(candidates, None, T0 + MINUTE) == [_id(0)]
    assert cutter.to_cut(candidates, _id(0), T0 + 4 * MINUTE) == [_id(1), _id(2), _id(3)]
    assert cutter.to_cut(candidates, _id(4), T0 + 60 * MINUTE) == []


def test_a_long_run_of_empty_windows_is_jumped_and_the_label_window_waits() -> None:
    cutter = WindowCutter(CLOCK, max_gap_passes=2)
    assert cutter.to_cut({_id(0), _id(2)}, None, T0 + 3 * MINUTE) == [_id(0), _id(1), _id(2)]
    assert cutter.to_cut({_id(0), _id(9)}, None, T0 + 10 * MINUTE) == [_id(0), _id(9)]
    labelled = WindowCutter(CLOCK, label_delay_ms=30_000)
    assert labelled.to_cut({_id(0)}, None, T0 + MINUTE) == []
    assert labelled.to_cut({_id(0)}, None, T0 + MINUTE + 30_000) == [_id(0)]


def test_pass_ids_of_an_array_match_one_by_one() -> None:
    import numpy as np

    cutter = WindowCutter(PassClock(600))
    times = np.array([T0, T0 + 599_999, T0 + 600_000, T0 - 1, T0 + 86_400_000])
    assert cutter.pass_ids_of(times) == [cutter.pass_id_of(int(t)) for t in times]
    assert cutter.pass_ids_of(times) == [PassClock(600).id_at(int(t)) for t in times]


@dataclass
class _Partition:
    join: PartitionJoin
    newest: int = 0
    offset: int = 0
    cut: list[str] = field(default_factory=list)


@dataclass
class _Run:
    """The builder's loop over partitions, on impressions only (label_in_impression)."""

    partitions: int
    lateness_ms: int
    cutter: WindowCutter
    owned: dict[int, _Partition] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # windows some partition has a slice of
    slices: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    late: int = 0
    dropped_within_lateness: list[str] = field(default_factory=list)
    closed_at_arrival: dict[str, bool] = field(default_factory=dict)  # id -> dropped at once

    def __post_init__(self) -> None:
        for p in range(self.partitions):
            join = PartitionJoin(labels=[], closed_through=None, replay_to={}, clock=CLOCK)
            self.owned[p] = _Partition(join)

    def deliver(self, p: int, events: list[tuple[str, int]]) -> None:
        """One poll's batch of partition ``p``: (event_id, event time) in offset order."""
        state = self.owned[p]
        closed = state.join.closed_through
        for event_id, t in events:
            dropped = closed is not None and CLOCK.id_at(t) <= closed
            self.closed_at_arrival.setdefault(event_id, dropped)  # closed when it first came
            if dropped and t >= state.newest - self.lateness_ms:  # on time is never dropped
                self.dropped_within_lateness.append(event_id)
        table = pa.table(
            {
                "event_id": [e for e, _ in events],
                "event_time_ms": pa.array([t for _, t in events], pa.int64()),
                "label": pa.array([0] * len(events), pa.int8()),
                "kafka_offset": pa.array(
                    range(state.offset, state.offset + len(events)), pa.int64()
                ),
            }
        )
        state.offset += len(events)
        state.join.add_impressions([self.cutter.pass_id_of(t) for _, t in events], table)
        state.newest = max(state.newest, *(t for _, t in events))
        self.cut_ready()

    def late_total(self) -> int:
        """Late impressions counted in slices and since the last one."""
        return self.late + sum(s.join.counters.late_impressions for s in self.owned.values())

    def cut_ready(self, watermark: int | None = None) -> None:
        newest_anywhere = max(s.newest for s in self.owned.values())
        for p, state in self.owned.items():
            wm = watermark
            if wm is None:
                wm = watermark_ms(
                    {IMP: state.newest}, [IMP], set(), newest_anywhere, self.lateness_ms
                )
            closed = state.join.closed_through
            candidates = set(state.join.pending) | {
                w for w in self.known if closed is None or w > closed
            }
            for window in self.cutter.to_cut(candidates, closed, wm):
                assert CLOCK.window(window)[1] <= wm, f"{window} cut before its watermark {wm}"
                assert (p, window) not in self.slices, f"partition {p} cut {window} twice"
                assert closed is None or window > closed, f"{window} cut after {closed}"
                table = state.join.close(window)
                rows = table.to_pylist() if table is not None else []
                assert all(CLOCK.id_at(r["event_time_ms"]) == window for r in rows)
                self.slices[(p, window)] = [r["event_id"] for r in rows]
                self.late += state.join.take_counters().late_impressions
                self.known.add(window)
                state.cut.append(window)
                closed = window


def _partition_of(event_id: str, partitions: int) -> int:
    return zlib.crc32(event_id.encode()) % partitions  # keyed by event_id, as producers do


@st.composite
def _streams(draw):
    """Events over 12 minutes in any order (late ones included), some sent twice, and how
    the consumer's polls cut the interleaving of partitions into batches."""
    partitions = draw(st.integers(1, 3))
    times = draw(st.lists(st.integers(0, 12 * MINUTE - 1), min_size=1, max_size=60))
    events = [(f"e{i}", T0 + t) for i, t in enumerate(times)]
    resent = draw(st.lists(st.sampled_from(events), max_size=10))
    order = draw(st.permutations(events + resent))
    sizes = draw(st.lists(st.integers(1, 8), min_size=len(order), max_size=len(order)))
    lateness = draw(st.sampled_from([0, 20_000, 90_000, 5 * MINUTE]))
    return partitions, order, sizes, lateness


@settings(max_examples=500, deadline=None)
@given(_streams(), st.sampled_from([1, 3, 100]))
def test_any_interleaving_puts_every_event_in_exactly_one_slice(stream, max_gap: int) -> None:
    partitions, order, sizes, lateness = stream
    run = _Run(partitions, lateness, WindowCutter(CLOCK, max_gap_passes=max_gap))
    pending: dict[int, list[tuple[str, int]]] = {p: [] for p in range(partitions)}
    for (event_id, t), size in zip(order, sizes, strict=True):
        p = _partition_of(event_id, partitions)
        pending[p].append((event_id, t))
        if len(pending[p]) >= size:
            run.deliver(p, pending[p])
            pending[p] = []
    for p, events in pending.items():
        if events:
            run.deliver(p, events)
    # the stream ends: every window closes; a second round, as the builder's next loop,
    # lets each partition see the slices the partitions after it wrote in the first
    for _ in range(2):
        run.cut_ready(watermark=T0 + 24 * 60 * MINUTE)

    sliced = [e for ids in run.slices.values() for e in ids]
    assert len(sliced) == len(set(sliced)), "an event in two slices"
    assert not any(s.join.pending for s in run.owned.values())
    lost = {e for e, late in run.closed_at_arrival.items() if late}
    assert set(sliced) == set(run.closed_at_arrival) - lost, "an event neither sliced nor late"
    assert run.late_total() >= len(lost)
    assert run.dropped_within_lateness == []
    for state in run.owned.values():
        assert state.cut == sorted(set(state.cut))
        for before, after in zip(state.cut, state.cut[1:], strict=False):
            if after != CLOCK.next(before):  # jumped: only a run longer than max_gap
                gap = (CLOCK.window(after)[0] - CLOCK.window(before)[1]) // MINUTE
                assert gap > max_gap, (before, after)
    # every window any partition cut assembles: each partition has its slice of it or has
    # cut past it (``streaming.slices.assemble_pass``), so no pass waits for ever
    for window in {w for _, w in run.slices}:
        for p, state in run.owned.items():
            assert (p, window) in run.slices or state.cut[-1] > window, (p, window, state.cut)


@pytest.mark.parametrize("lateness", [0, 30_000])
def test_an_event_older_than_the_lateness_is_counted_late_not_sliced(lateness: int) -> None:
    run = _Run(1, lateness, WindowCutter(CLOCK))
    run.deliver(0, [("a", T0 + 10_000)])
    run.deliver(0, [("b", T0 + MINUTE + lateness + 1)])  # closes window 0
    assert run.slices == {(0, _id(0)): ["a"]}
    run.deliver(0, [("c", T0 + 20_000), ("a", T0 + 10_000)])  # late, and a resent copy
    assert run.late_total() == 2 and run.slices == {(0, _id(0)): ["a"]}
