"""Per-partition join state: impressions held for their labels, rows written as the plan says.

Pure logic on Arrow tables and plain values (no Kafka, no files), so it is tested directly. One
``PartitionJoin`` owns partition ``p`` of the impressions topic and partition ``p`` of each
joined label's topic (the clicks, the conversions; all keyed by ``event_id``, so they are
co-partitioned). Labels the impression carries itself arrive with it. When each row is
written is ``streaming.emit_plan``'s: in event time, so which pass holds a row depends on
the events' times only.

    impression              -> held (late if its window is already closed)
    label event             -> attached to its held impression (first event wins; repeats
                               are duplicates), else held as unmatched until it expires; a
                               positive its observed row will not carry is a duplicate to
                               write when it comes; one read after its row was written is late
    close(P), horizon H     -> every row whose time is below H = end(P) + the cut delay:
                               observed rows (each label as of the row's time), duplicate
                               positives, and (a delayed plan) matured rows with the final
                               labels; an impression is dropped once its last row is written

A label counts if its event came within its window of the impression (later ones are late);
a positive whose row lacks the label it ``requires`` is unattributed: kept, or trained as 0
and dead-lettered. State is never persisted on its own: it is rebuilt by replaying the
topics from the newest slice's ``resume_offsets`` (the lowest offsets still held). A row
below the newest slice's horizon was written (or was late) before the restart and is not
written again; what is decided when an event is read (malformed, duplicate, late) or
expires (unmatched) was counted in a slice if the event lies below that slice's
``consumed_to``; what is decided when an impression's last row is written (late beyond the
window, unattributed) concerns an impression no slice has finished yet, so it is new.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.emit_plan import AFTER_WINDOW, AT_ONCE, EmitPlan, JoinedLabel, emit_plan
from streaming.join_spill import LabelEvent, Segment, SpillSettings, SpillStore, segment_of
from streaming.windows import WindowCutter
from streamrec.config import ELAPSED_COLUMN, delay_column, kind_column
from streamrec.passes import PassClock, RowKind

IMPRESSIONS = "impressions"
NEVER = -(2**62)  # before any event time, and below it by any delay still an int64
# what an entry of the join's in-memory indexes costs beyond the rows' Arrow buffers, in
# bytes (bench/label_memory.py: 163 MiB per million impressions held, Python's dict, str
# and int; a label event's dataclass about as much again)
IMPRESSION_ENTRY_BYTES = 171
LABEL_ENTRY_BYTES = 200


@dataclass(frozen=True)
class Stray:
    """A label event that labels no row, to be dead-lettered (its label says so)."""

    kind: str
    offset: int
    event_id: str
    time_ms: int
    reason: str  # late, duplicate, unmatched, unattributed


@dataclass
class LabelCounters:
    """What happened to one joined label's events since the last slice."""

    late: int = 0  # later than the label's window, or read after their row was written
    duplicate: int = 0  # further events for an impression already labelled
    unmatched: int = 0  # events whose impression is not held (written or unseen)
    unattributed: int = 0  # positives whose row lacks the label they require


@dataclass
class JoinCounters:
    """What happened to events since the last slice of this partition."""

    late_impressions: int = 0  # impressions for windows already closed
    labels: dict[str, LabelCounters] = field(default_factory=dict)  # joined label -> counts
    malformed: Counter[str] = field(default_factory=Counter)

    def of(self, kind: str) -> LabelCounters:
        """The counters of the joined label ``kind``."""
        return self.labels.setdefault(kind, LabelCounters())


class PartitionJoin:
    """Impressions and label events of one partition, between two slices."""

    def __init__(
        self,
        *,
        labels: Sequence[JoinedLabel],
        closed_through: str | None,
        replay_to: dict[str, int],
        clock: PassClock,
        plan: EmitPlan | None = None,
        cut_consumed: Callable[[str], int | None] | None = None,
        spill: SpillSettings | None = None,
    ) -> None:
        """``plan`` defaults to every label joined, after its window; ``cut_consumed(w)``
        says up to which impression offset this partition had read when it cut window
        ``w`` (None: unknown), which tells a replayed impression that was late from one
        that is still held; ``spill`` (None: everything stays in memory) where rows past
        its budget go (``streaming.join_spill``)."""
        self.labels = {label.kind: label for label in labels}
        self.plan = plan or emit_plan(labels, {x.kind: x.column for x in labels})
        self._row_fields = self.plan.row_fields()
        self._clock = clock
        self.closed_through = closed_through
        self.horizon_ms = self._horizon(closed_through)
        self.replay_to = replay_to  # topic kind -> consumed_to of the newest slice
        self._cut_consumed = cut_consumed
        self._consumed_at: dict[str, int | None] = {}  # closed window -> cut_consumed of it
        # impression window -> its held rows: in memory, or segments in the spill store
        self.pending: dict[str, list[pa.Table | Segment]] = {}
        self._time_of: dict[str, int] = {}  # held event_id -> its impression's time
        self._held: dict[str, dict[str, LabelEvent]] = {k: {} for k in self.labels}
        self._unmatched: dict[str, dict[str, LabelEvent]] = {k: {} for k in self.labels}
        self._duplicates: list[tuple[int, str, str]] = []  # heap of (time, event_id, kind)
        self._windows = WindowCutter(clock)  # the pass id of a time, cached
        self.counters = JoinCounters()
        # kind -> offsets of the label events whose positives the last cut wrote
        self.used_offsets: dict[str, list[int]] = {}
        self.matured: pa.Table | None = None  # the last cut's matured rows
        self.open: dict[str, int] = {}  # label -> rows written, window open, at the last cut
        self.strays: list[Stray] = []  # new events to dead-letter, taken by the caller
        self._spill = spill
        self._store: SpillStore | None = None  # opened by the first checkpoint or restore
        self._hot_arrow = 0  # bytes of the held rows in memory
        self._checkpoints = 0  # names the segments each checkpoint writes
        # impression window -> label -> lowest offset of its label events in the store
        self._cold_labels: dict[str, dict[str, int]] = {}
        # steps (passes.step_seconds): open window -> the impression offset read up to at
        # its newest step (a replayed impression below it is in a step already), and the
        # event ids its steps wrote (a repeated impression is still one)
        self.step_consumed: dict[str, int] = {}
        self._stepped_ids: dict[str, list[str]] = {}

    # -- time --------------------------------------------------------------------------

    def _horizon(self, window: str | None) -> int | None:
        if window is None:
            return None
        return self._clock.window(window)[1] + self.plan.cut_delay_ms

    def _pass_of(self, ms: int) -> str:
        return self._windows.pass_id_of(ms)

    def due_windows(self) -> set[str]:
        """Pass windows rows of the held impressions are still due in (each held window's
        rows at each delay, and the next duplicate's): the builder cuts them even where no
        impression of their own came. Without a delayed label they are the held windows
        themselves: none beyond them."""
        plan, cut = self.plan, self.plan.cut_delay_ms
        if not plan.delayed:
            return set()
        delays = [d for d, _ in plan.groups] + ([plan.mature_ms] if plan.delayed else [])
        due = set()
        for window in self.pending:
            start, end = self._clock.window(window)
            for d in delays:
                due |= {self._pass_of(start + d - cut), self._pass_of(end - 1 + d - cut)}
        if self._duplicates:
            due.add(self._pass_of(self._duplicates[0][0] - cut))
        if self._store is not None and (first := self._store.first_due()) is not None:
            due.add(self._pass_of(first - cut))
        return due

    # -- reading -----------------------------------------------------------------------

    def is_replay(self, kind: str, offset: int) -> bool:
        return offset < self.replay_to.get(kind, -1)

    def malformed(self, kind: str, offset: int, reason: str) -> bool:
        """Count a malformed event unless it is a replay; True when it is new."""
        if self.is_replay(kind, offset):
            return False
        self.counters.malformed[reason] += 1
        return True

    def _claim_orphans(self, event_ids: set[str]) -> None:
        for kind, unmatched in self._unmatched.items():
            for event_id in event_ids.intersection(unmatched) if unmatched else ():
                event = self._held[kind][event_id] = unmatched.pop(event_id)
                self._attached(kind, event_id, event, self._time_of[event_id])

    def _still_held(self, window: str, time_ms: int, offset: int) -> bool:
        """Whether a replayed impression of a closed window still has rows to be written
        and was not late when first read."""
        horizon = self.horizon_ms
        if horizon is None or time_ms + self.plan.final_ms < horizon:
            return False
        if window not in self._consumed_at:  # one slice read per window, not per row
            self._consumed_at[window] = self._cut_consumed(window) if self._cut_consumed else None
        consumed = self._consumed_at[window]
        return consumed is None or offset < consumed

    def _not_stepped(self, windows: list[str], table: pa.Table) -> tuple[list[str], pa.Table]:
        """The rows of a replayed batch that no published step of their window holds."""
        offsets = table.column("kafka_offset")
        if pc.min(offsets).as_py() >= max(self.step_consumed.values()):
            return windows, table  # read after every step: the live case
        below = [self.step_consumed.get(w, -1) for w in windows]
        keep = np.greater_equal(offsets.to_numpy(), np.array(below, dtype=np.int64))
        return [w for w, k in zip(windows, keep, strict=True) if k], table.filter(keep)

    def add_impressions(self, windows: list[str], table: pa.Table) -> None:
        """Hold a batch of impression rows (pass columns); ``windows[i]`` is row i's."""
        if self.step_consumed and table.num_rows:
            windows, table = self._not_stepped(windows, table)
            if not windows:
                return
        closed, replay_to = self.closed_through, self.replay_to.get(IMPRESSIONS, -1)
        time_of = self._time_of
        ids = table.column("event_id").to_pylist()
        times = table.column("event_time_ms").to_pylist()
        distinct_windows, fresh = set(windows), set(ids)
        spilled = self._spilled(ids)
        if (
            (closed is None or min(distinct_windows) > closed)
            and len(fresh) == len(ids)
            and time_of.keys().isdisjoint(fresh)
            and not spilled
        ):  # the usual batch: nothing late, nothing repeated; no loop per row needed
            time_of.update(zip(ids, times, strict=True))
            self._claim_orphans(fresh)
            if len(distinct_windows) == 1:
                self._hold(windows[0], table)
            else:
                labels = pa.array(windows)
                for window in sorted(distinct_windows):
                    self._hold(window, table.filter(pc.equal(labels, window)))
            return
        groups: dict[str, list[int]] = {}
        offsets = table.column("kafka_offset").to_pylist()
        taken: set[str] = set()
        rows = zip(ids, windows, times, offsets, strict=True)
        for i, (event_id, window, time_ms, offset) in enumerate(rows):
            if event_id in time_of or event_id in spilled:
                continue  # the same impression twice (a producer retry without idempotence)
            if closed is not None and window <= closed:
                if offset >= replay_to:
                    self.counters.late_impressions += 1
                    continue
                if not self._still_held(window, time_ms, offset):
                    continue  # a replay of an impression whose rows were all written
            time_of[event_id] = time_ms
            taken.add(event_id)
            groups.setdefault(window, []).append(i)
        self._claim_orphans(taken)
        for window, group in groups.items():
            self._hold(window, table if len(group) == table.num_rows else table.take(group))

    def _hold(self, window: str, table: pa.Table) -> None:
        self.pending.setdefault(window, []).append(table)
        self._hot_arrow += table.nbytes

    def add_impression(self, window: str, row: dict[str, Any]) -> None:
        """Hold one impression row."""
        self.add_impressions([window], pa.Table.from_pylist([row]))

    def _stray(self, kind: str, event_id: str, event: LabelEvent, reason: str) -> None:
        if self.labels[kind].dead_letter_strays or reason == "unattributed":
            self.strays.append(Stray(kind, event.offset, event_id, event.time_ms, reason))

    def _attached(self, kind: str, event_id: str, event: LabelEvent, imp_ms: int) -> None:
        """A label event just joined its held impression (of time ``imp_ms``): a positive
        its observed row will not carry is a duplicate due when it happened; one whose row
        (observed or duplicate) was already written when it was read is late."""
        label = self.labels[kind]
        delay = event.time_ms - imp_ms
        if delay > label.window_ms:
            return  # late, decided when the impression's last row is written
        in_observed = label.emit == AFTER_WINDOW or (
            label.emit != AT_ONCE and delay <= label.wait_ms
        )
        due = imp_ms + self.plan.delay_of(kind) if in_observed else max(event.time_ms, imp_ms)
        if self.horizon_ms is not None and due < self.horizon_ms:
            event.late = True
            if not event.replayed:  # else written, or counted late, before the restart
                self.counters.of(kind).late += 1
                self._stray(kind, event_id, event, "late")
        elif not in_observed:
            heapq.heappush(self._duplicates, (due, event_id, kind))

    def add_label(self, kind: str, event_id: str, time_ms: int, offset: int) -> None:
        """Attach a label event of ``kind`` to its held impression, or hold it until it
        expires."""
        event = LabelEvent(time_ms, offset, self.is_replay(kind, offset))
        imp_ms = self._impression_time(event_id)
        attached = imp_ms is not None
        held = self._held[kind] if attached else self._unmatched[kind]
        first = self._label_event(kind, event_id) if attached else held.get(event_id)
        if first is None:
            held[event_id] = event
            if imp_ms is not None:
                self._attached(kind, event_id, event, imp_ms)
            return
        # the earliest event labels the row; the resume keeps the lower offset of the two
        keep, drop = (event, first) if time_ms < first.time_ms else (first, event)
        kept = LabelEvent(keep.time_ms, min(offset, first.offset), keep.replayed, first.late)
        held[event_id] = kept
        if not event.replayed:
            self.counters.of(kind).duplicate += 1
            self._stray(kind, event_id, drop, "duplicate")

    def expire_unmatched(self, watermark_ms: int) -> None:
        """Drop held label events no held impression can claim any more; count the new
        ones."""
        for kind, unmatched in self._unmatched.items():
            window_ms_ = self.labels[kind].window_ms
            for event_id, event in list(unmatched.items()):
                if event.time_ms + window_ms_ < watermark_ms:
                    del unmatched[event_id]
                    if not event.replayed:
                        self.counters.of(kind).unmatched += 1
                        self._stray(kind, event_id, event, "unmatched")

    # -- cutting -------------------------------------------------------------------------

    def _take(self, start_ms: int, end_ms: int, remove: bool) -> pa.Table | None:
        """Held impressions of times in [start_ms, end_ms), oldest window first; with
        ``remove`` they are held no more."""
        pieces = []
        for window in sorted(self.pending):
            w_start, w_end = self._clock.window(window)
            if w_end <= start_ms or w_start >= end_ms:
                continue
            table = self._load(window)
            if start_ms <= w_start and w_end <= end_ms:
                pieces.append(table)
                if remove:
                    self._drop(window)
                continue
            times = table["event_time_ms"]
            inside = pc.and_(pc.greater_equal(times, start_ms), pc.less(times, end_ms))
            pieces.append(table.filter(inside))
            if remove:
                self._drop(window)
                if (rest := table.filter(pc.invert(inside))).num_rows:
                    self.pending[window] = [rest]  # in memory until the next checkpoint
        pieces = [p for p in pieces if p.num_rows]
        if not pieces:
            return None
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]

    def take_step(self, window: str) -> pa.Table | None:
        """Every row of ``window`` held now, final (labels carried in the impressions: the
        config allows steps only then), held no more; None when there are none. Their
        event ids stay known until the window closes."""
        if window not in self.pending:
            return None
        table = self._load(window)
        self._drop(window)
        self._stepped_ids.setdefault(window, []).extend(table.column("event_id").to_pylist())
        self._hot_arrow = sum(t.nbytes for t in self._hot_tables())
        return table

    def close(self, window: str) -> pa.Table | None:
        """The rows due by ``window``'s horizon (None when there are none), a delayed plan's
        observed rows and duplicates ordered by when each became known (impression time
        plus elapsed); its matured rows are left in ``matured``. The window is closed from
        now on."""
        plan = self.plan
        start = NEVER if self.horizon_ms is None else self.horizon_ms
        horizon = self._horizon(window)
        assert horizon is not None
        self.closed_through, self.horizon_ms = window, horizon
        self.used_offsets, self.matured = {}, None
        for stepped in [w for w in self._stepped_ids if w <= window]:
            for event_id in self._stepped_ids.pop(stepped):
                self._time_of.pop(event_id, None)
        for stepped in [w for w in self.step_consumed if w <= window]:
            del self.step_consumed[stepped]
        final = not plan.delayed
        rows = []
        for delay, names in plan.groups:
            taken = self._take(start - delay, horizon - delay, remove=final)
            if taken is None:
                continue
            if final:
                rows.append(self._final(taken))
            else:
                rows.append(self._observed(taken, delay, names))
        if plan.delayed:
            if (duplicates := self._due_duplicates(horizon)) is not None:
                rows.append(duplicates)
            matured = self._take(start - plan.mature_ms, horizon - plan.mature_ms, remove=True)
            if matured is not None:
                self.matured = self._final(matured)
        self.open = self._open(horizon)
        self._hot_arrow = sum(t.nbytes for t in self._hot_tables())
        if not rows:
            return None
        table = pa.concat_tables(rows) if len(rows) > 1 else rows[0]
        if plan.delayed:
            # in the order the rows became known, as a live stream teaches them: observed
            # rows then duplicates made whole training batches of negatives, then of
            # positives, and cost at_once 0.12 AUC (docs/decisions/)
            known = pc.add(table["event_time_ms"], table[ELAPSED_COLUMN])
            table = table.take(pc.sort_indices(known))
        return table

    def _events(self, kind: str, ids: list[str]) -> list[LabelEvent | None]:
        """The ``kind`` event held for each impression, in memory or spilled (None: none)."""
        held = self._held[kind]
        found = [held.get(event_id) for event_id in ids]
        if self._store is not None and (missing := [i for i, e in enumerate(found) if e is None]):
            spilled = self._store.label_events(kind, [ids[i] for i in missing])
            for i, event in zip(missing, spilled, strict=True):
                found[i] = event
        return found

    def _positive_as_of(
        self, name: str, table: pa.Table, ids: list[str], as_of: np.ndarray
    ) -> np.ndarray:
        """Label ``name`` of each row as it stood at ``as_of`` (event time per row): its
        event within its window and no later than ``as_of``; a carried label as given."""
        label = self.labels.get(name)
        if label is None:
            return table[self.plan.columns[name]].to_numpy().astype(np.int8)
        times = table["event_time_ms"].to_numpy()
        values = np.zeros(len(ids), dtype=np.int8)
        for i, event in enumerate(self._events(name, ids)):
            if event is not None and event.time_ms <= as_of[i]:
                values[i] = event.time_ms - times[i] <= label.window_ms
        return values

    def _with_columns(self, table: pa.Table, columns: dict[str, np.ndarray]) -> pa.Table:
        """``table`` with its label columns set from ``columns`` and a delayed plan's row
        columns appended (or set), in the pass schema's order."""
        for column in self.plan.columns.values():
            if (values := columns.get(column)) is not None:
                index = table.schema.get_field_index(column)
                f = table.schema.field(index)
                table = table.set_column(index, f, pa.array(values, f.type))
        for f in self._row_fields:
            array = pa.array(columns[f.name], f.type)
            index = table.schema.get_field_index(f.name)
            if index < 0:
                table = table.append_column(f, array)
            else:
                table = table.set_column(index, f, array)
        return table

    def _attribute(self, name: str, values: np.ndarray, required: np.ndarray) -> np.ndarray:
        """``values`` with the positives lacking their required label cleared, unless the
        label keeps them."""
        if self.labels[name].keep_unattributed:
            return values
        return np.where((values == 1) & (required == 0), 0, values).astype(np.int8)

    def _observed(self, table: pa.Table, delay: int, names: tuple[str, ...]) -> pa.Table:
        """Observed rows of a delayed plan, for the labels ``names`` written ``delay`` after
        the impression: each label as of then (an at_once label always 0), the others
        absent."""
        ids = table["event_id"].to_pylist()
        as_of = table["event_time_ms"].to_numpy() + delay
        columns: dict[str, np.ndarray] = {}
        for name, column in self.plan.columns.items():
            kind = RowKind.OBSERVED if name in names else RowKind.ABSENT
            columns[kind_column(name)] = np.full(len(ids), kind, dtype=np.int8)
            label = self.labels.get(name)
            if label is None:
                continue
            values = self._positive_as_of(name, table, ids, as_of)
            columns[delay_column(name)] = self._delays(name, table, ids, as_of)
            if name not in names or label.emit == AT_ONCE:
                values = np.zeros(len(ids), dtype=np.int8)
            elif label.requires is not None:
                required = self._positive_as_of(label.requires, table, ids, as_of)
                values = self._attribute(name, values, required)
            columns[column] = values
            if name in names:
                self._note_used(name, ids, values)
        columns[ELAPSED_COLUMN] = np.full(len(ids), delay, dtype=np.int64)
        return self._with_columns(table, columns)

    def _delays(self, name: str, table: pa.Table, ids: list[str], as_of: np.ndarray) -> np.ndarray:
        """Time from each impression to its ``name`` event, if it came by ``as_of``; -1."""
        times = table["event_time_ms"].to_numpy()
        delays = np.full(len(ids), -1, dtype=np.int64)
        for i, event in enumerate(self._events(name, ids)):
            if event is not None and event.time_ms <= as_of[i]:
                delays[i] = event.time_ms - times[i]
        return delays

    def _note_used(self, kind: str, ids: list[str], values: np.ndarray) -> None:
        positives = [ids[i] for i in np.flatnonzero(values == 1)]
        self._use(kind, [e.offset for e in self._events(kind, positives) if e is not None])

    def _use(self, kind: str, offsets: list[int]) -> None:
        """Note the label events a slice's rows were labelled by; a kind with none is not
        noted (a slice names the range of offsets it used, and none has no range)."""
        if offsets:
            self.used_offsets.setdefault(kind, []).extend(offsets)

    def _due_duplicates(self, horizon: int) -> pa.Table | None:
        """The duplicate positives due before ``horizon``, each a copy of its impression
        with its label 1 and every other label absent."""
        entries = self._store.take_due(horizon) if self._store is not None else []
        while self._duplicates and self._duplicates[0][0] < horizon:
            entries.append(heapq.heappop(self._duplicates))
        due: dict[str, list[tuple[int, str, str]]] = {}
        times = self._impression_times([event_id for _, event_id, _ in entries])
        for entry, time_ms in zip(entries, times, strict=True):
            assert time_ms is not None, "a duplicate's impression is held until its last row"
            due.setdefault(self._pass_of(time_ms), []).append(entry)
        pieces = []
        for window, entries in due.items():
            table = self._load(window)
            position = {e: i for i, e in enumerate(table["event_id"].to_pylist())}
            for kind in {k for _, _, k in entries}:
                mine = [(at, e) for at, e, k in entries if k == kind]
                rows = table.take([position[e] for _, e in mine])
                if (piece := self._duplicate_rows(kind, rows, mine)) is not None:
                    pieces.append(piece)
        if not pieces:
            return None
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]

    def _duplicate_rows(
        self, kind: str, table: pa.Table, due: list[tuple[int, str]]
    ) -> pa.Table | None:
        ids = [e for _, e in due]
        at = np.array([a for a, _ in due], dtype=np.int64)
        label = self.labels[kind]
        keep = np.ones(len(ids), dtype=bool)
        if label.requires is not None and not label.keep_unattributed:
            keep = self._positive_as_of(label.requires, table, ids, at) == 1
            if not keep.any():
                return None
            table, ids, at = (
                table.filter(pa.array(keep)),
                [e for e, k in zip(ids, keep, strict=True) if k],
                at[keep],
            )
        n = len(ids)
        columns: dict[str, np.ndarray] = {}
        for name, column in self.plan.columns.items():
            mine = name == kind
            columns[kind_column(name)] = np.full(n, RowKind.DUPLICATE if mine else 0, np.int8)
            columns[column] = np.full(n, 1 if mine else 0, dtype=np.int8)
            if name in self.labels:
                columns[delay_column(name)] = self._delays(name, table, ids, at)
        columns[ELAPSED_COLUMN] = at - table["event_time_ms"].to_numpy()
        self._use(kind, [e.offset for e in self._events(kind, ids) if e is not None])
        return self._with_columns(table, columns)

    def _final(self, table: pa.Table) -> pa.Table:
        """The impressions' rows with their final labels: each label 1 iff its event came
        within its window; the impressions and their events are held no more. Late events
        and unattributed positives are counted (and dead-lettered) here, once."""
        ids = table.column("event_id").to_pylist()
        time_of = self._time_of
        spilled = [event_id for event_id in ids if time_of.pop(event_id, None) is None]
        if not self.labels:
            self._forget(spilled, {})
            return table
        times = table.column("event_time_ms").to_numpy()
        columns: dict[str, np.ndarray] = {}
        events: dict[str, list[LabelEvent | None]] = {}
        delays: dict[str, np.ndarray] = {}
        position = {event_id: i for i, event_id in enumerate(ids)} if spilled else {}
        spilled_events: dict[str, list[str]] = {}
        for kind, label in self.labels.items():
            held = self._held[kind]
            found = [held.pop(event_id, None) for event_id in ids]
            if spilled and self._store is not None:
                mine = spilled_events[kind] = []
                for event_id, event in zip(
                    spilled, self._store.label_events(kind, spilled), strict=True
                ):
                    if event is not None:
                        mine.append(event_id)
                        if found[position[event_id]] is None:
                            found[position[event_id]] = event
            values = np.zeros(len(ids), dtype=np.int8)
            delay = np.full(len(ids), -1, dtype=np.int64)
            for i, event in enumerate(found):
                if event is None:
                    continue
                delay[i] = event.time_ms - times[i]
                if delay[i] <= label.window_ms:
                    values[i] = 1
                else:  # an impression's last row is new even if its event was read before
                    self.counters.of(kind).late += 1
                    self._stray(kind, ids[i], event, "late")
            columns[label.column], events[kind], delays[kind] = values, found, delay
        self._forget(spilled, spilled_events)
        for kind, label in self.labels.items():
            if label.requires is None:
                continue
            required_column = self.plan.columns[label.requires]
            required = columns.get(required_column)
            if required is None:
                required = table.column(required_column).to_numpy()
            values = columns[label.column]
            for i in np.flatnonzero((values == 1) & (required == 0)):
                event = events[kind][i]
                assert event is not None  # a positive has its event
                self.counters.of(kind).unattributed += 1
                if not label.keep_unattributed:
                    values[i] = 0
                    self._stray(kind, ids[i], event, "unattributed")
        if self.plan.delayed:
            for name in self.plan.columns:
                columns[kind_column(name)] = np.full(len(ids), RowKind.MATURED, dtype=np.int8)
            columns |= {delay_column(kind): d for kind, d in delays.items()}
            columns[ELAPSED_COLUMN] = np.full(len(ids), self.plan.mature_ms, dtype=np.int64)
        else:  # the one row of each impression: its label events are what labelled it
            for kind, found in events.items():
                self._use(kind, [e.offset for e in found if e is not None])
        return self._with_columns(table, columns)

    def _forget(self, spilled: list[str], events: dict[str, list[str]]) -> None:
        """Delete written impressions from the spill store, and the label events found
        there (only a spilled impression has spilled label events: a checkpoint moves
        both)."""
        if spilled and self._store is not None:
            self._store.delete(impressions=spilled, labels=events)

    def _open(self, horizon: int) -> dict[str, int]:
        """Per label written before its window closes: held impressions whose row is written
        and whose window for that label is still open at ``horizon``."""
        if not self.plan.delayed:
            return {}
        counts = {}
        parts = [(w, p) for w, ps in self.pending.items() for p in ps]
        for kind, label in self.labels.items():
            if label.emit == AFTER_WINDOW:
                continue
            start, end = horizon - label.window_ms, horizon - self.plan.delay_of(kind)
            counts[kind] = sum(self._count_between(w, p, start, end) for w, p in parts)
        return counts

    def _count_between(self, window: str, part: pa.Table | Segment, start: int, end: int) -> int:
        """Held rows of ``part`` with a time in [start, end)."""
        if isinstance(part, Segment):
            if start % 1000 == 0 and end % 1000 == 0:
                return part.count_between(start, end)
            part = self._segment(part)
        times = part["event_time_ms"]
        inside = pc.and_(pc.greater_equal(times, start), pc.less(times, end))
        return int(pc.sum(inside).as_py() or 0)

    def take_counters(self) -> JoinCounters:
        """The counters since the last slice; they restart from zero."""
        counters, self.counters = self.counters, JoinCounters()
        return counters

    def take_strays(self) -> list[Stray]:
        """The label events to dead-letter found since the last call."""
        strays, self.strays = self.strays, []
        return strays

    def waiting(self) -> int:
        """Impressions held for rows not yet written, in memory or spilled."""
        return sum(
            p.rows if isinstance(p, Segment) else p.num_rows
            for parts in self.pending.values()
            for p in parts
        )

    def lowest_needed(self, kind: str) -> int | None:
        """Lowest offset of ``kind`` still held, in memory or spilled (None: nothing held):
        for spilled label events, the lowest of their impression window's when spilled."""
        if kind == IMPRESSIONS:
            offsets = [
                p.min_offset if isinstance(p, Segment) else pc.min(p["kafka_offset"]).as_py()
                for parts in self.pending.values()
                for p in parts
            ]
        else:
            held = (*self._held[kind].values(), *self._unmatched[kind].values())
            offsets = [e.offset for e in held]
            offsets += [m[kind] for m in self._cold_labels.values() if kind in m]
        return min(offsets, default=None)

    # -- the spill store ---------------------------------------------------------------

    def _spilled(self, event_ids: list[str]) -> set[str]:
        """Which of these impressions are held in the spill store."""
        if self._store is None:
            return set()
        times = self._store.impression_times(event_ids)
        return {e for e, t in zip(event_ids, times, strict=True) if t is not None}

    def _impression_time(self, event_id: str) -> int | None:
        """The time of a held impression, in memory or spilled (None: not held)."""
        time_ms = self._time_of.get(event_id)
        if time_ms is None and self._store is not None:
            time_ms = self._store.impression_times([event_id])[0]
        return time_ms

    def _impression_times(self, event_ids: list[str]) -> list[int | None]:
        found = [self._time_of.get(event_id) for event_id in event_ids]
        if self._store is not None and (missing := [i for i, t in enumerate(found) if t is None]):
            spilled = self._store.impression_times([event_ids[i] for i in missing])
            for i, time_ms in zip(missing, spilled, strict=True):
                found[i] = time_ms
        return found

    def _label_event(self, kind: str, event_id: str) -> LabelEvent | None:
        return self._events(kind, [event_id])[0]

    def _hot_tables(self) -> list[pa.Table]:
        return [p for parts in self.pending.values() for p in parts if isinstance(p, pa.Table)]

    def _load(self, window: str) -> pa.Table:
        """Every held row of ``window``, spilled segments read back; rows held only in
        memory are kept as one table from now on."""
        parts = self.pending[window]
        tables = [self._segment(p) if isinstance(p, Segment) else p for p in parts]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if not any(isinstance(p, Segment) for p in parts):
            self.pending[window] = [table]
        return table

    def _segment(self, segment: Segment) -> pa.Table:
        if self._store is None:
            raise RuntimeError("a spilled segment without its store")
        return self._store.segment(segment.key)

    def _drop(self, window: str) -> None:
        """Hold no rows of ``window`` any more: its spilled segments are deleted."""
        parts = self.pending.pop(window)
        if self._store is not None:
            self._store.delete(segments=[p.key for p in parts if isinstance(p, Segment)])
        self._cold_labels.pop(window, None)

    @property
    def spilled(self) -> bool:
        """Whether this join keeps its state in a spill store, checkpointed from now on."""
        return self._store is not None

    def hot_bytes(self) -> int:
        """What the state held in memory takes, estimated: the rows' Arrow buffers and the
        indexes' measured cost per entry (bench/label_memory.py)."""
        labels = sum(len(h) for h in self._held.values())
        return (
            self._hot_arrow
            + IMPRESSION_ENTRY_BYTES * len(self._time_of)
            + LABEL_ENTRY_BYTES * labels
        )

    def over_budget(self) -> bool:
        """Whether the memory held is past this partition's share of the spill budget."""
        return self._spill is not None and self.hot_bytes() > self._spill.hot_bytes

    def checkpoint(self, read_to: dict[str, int], newest_ms: dict[str, int]) -> None:
        """Move the state held in memory into the spill store, with where the partition has
        read to (topic kind -> offset) and its newest event times, in one atomic write: a
        restart resumes from here. The caller has taken the strays."""
        if self._spill is None:
            raise RuntimeError("this join has no spill store")
        if self._store is None:  # nothing restored: whatever is there is stale
            SpillStore.remove(self._spill.path)
            self._store = SpillStore(self._spill.path, self._spill.store_mib)
        self._checkpoints += 1
        for kind, events in self._held.items():
            times = self._impression_times(list(events))
            for event, time_ms in zip(events.values(), times, strict=True):
                assert time_ms is not None, "a held label event's impression is held"
                mins = self._cold_labels.setdefault(self._pass_of(time_ms), {})
                mins[kind] = min(mins.get(kind, event.offset), event.offset)
        segments = []
        for window, parts in self.pending.items():
            hot = [p for p in parts if isinstance(p, pa.Table) and p.num_rows]
            if not hot:
                continue
            table = pa.concat_tables(hot) if len(hot) > 1 else hot[0]
            key = f"{window}-{self._checkpoints:012d}.arrow"
            segments.append((key, table))
            spilled = [p for p in parts if isinstance(p, Segment)]
            self.pending[window] = [*spilled, segment_of(key, table)]
        counters = self.counters
        meta = {
            "fingerprint": self._spill.fingerprint,
            "closed_through": self.closed_through,
            "read_to": read_to,
            "newest_ms": newest_ms,
            "checkpoints": self._checkpoints,
            "pending": {
                w: [p.to_json() for p in parts if isinstance(p, Segment)]
                for w, parts in self.pending.items()
            },
            "cold_labels": self._cold_labels,
            "counters": {
                "late_impressions": counters.late_impressions,
                "labels": {k: vars(c) for k, c in counters.labels.items()},
                "malformed": dict(counters.malformed),
            },
        }
        self._store.checkpoint(
            impressions=self._time_of,
            labels=self._held,
            duplicates=self._duplicates,
            segments=segments,
            unmatched=self._unmatched,
            meta=meta,
        )
        self._time_of, self._duplicates, self._hot_arrow = {}, [], 0
        self._held = {k: {} for k in self.labels}

    def restore(self) -> tuple[dict[str, int], dict[str, int]] | None:
        """Resume from the spill store's checkpoint if one was taken by this pipeline after
        the cut of this join's newest slice: returns where the partition had read to and
        its newest event times. Otherwise (no store, another pipeline's, a cut not
        checkpointed: dirty) the store is removed and None says to replay the topics."""
        if self._spill is None or not self._spill.path.exists():
            return None
        store = SpillStore(self._spill.path, self._spill.store_mib)
        meta = store.meta()
        if (
            meta is None
            or meta["fingerprint"] != self._spill.fingerprint
            or meta["closed_through"] != self.closed_through
        ):
            store.close()
            SpillStore.remove(self._spill.path)
            return None
        self._store, self._checkpoints = store, meta["checkpoints"]
        self.pending = {
            w: [Segment.from_json(p) for p in parts] for w, parts in meta["pending"].items()
        }
        self._cold_labels = meta["cold_labels"]
        store.prune({p.key for parts in self.pending.values() for p in parts})
        counters = meta["counters"]
        self.counters = JoinCounters(
            late_impressions=counters["late_impressions"],
            labels={k: LabelCounters(**c) for k, c in counters["labels"].items()},
            malformed=Counter(counters["malformed"]),
        )
        for kind, event_id, event in store.unmatched():
            self._unmatched[kind][event_id] = event
        return meta["read_to"], meta["newest_ms"]

    def close_store(self) -> None:
        """Close the spill store (the partition changed hands or the builder stops)."""
        if self._store is not None:
            self._store.close()
            self._store = None
