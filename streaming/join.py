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
from streaming.windows import WindowCutter
from streamrec.config import ELAPSED_COLUMN, delay_column, kind_column
from streamrec.passes import RowKind, window_ms

IMPRESSIONS = "impressions"
NEVER = -(2**62)  # before any event time, and below it by any delay still an int64


@dataclass
class _LabelEvent:
    time_ms: int
    offset: int
    replayed: bool
    late: bool = False  # read after the row it belonged in was written


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
        plan: EmitPlan | None = None,
        pass_minutes: int = 10,
        cut_consumed: Callable[[str], int | None] | None = None,
    ) -> None:
        """``plan`` defaults to every label joined, after its window; ``cut_consumed(w)``
        says up to which impression offset this partition had read when it cut window
        ``w`` (None: unknown), which tells a replayed impression that was late from one
        that is still held."""
        self.labels = {label.kind: label for label in labels}
        self.plan = plan or emit_plan(labels, {x.kind: x.column for x in labels})
        self._row_fields = self.plan.row_fields()
        self._minutes = pass_minutes
        self.closed_through = closed_through
        self.horizon_ms = self._horizon(closed_through)
        self.replay_to = replay_to  # topic kind -> consumed_to of the newest slice
        self._cut_consumed = cut_consumed
        self._consumed_at: dict[str, int | None] = {}  # closed window -> cut_consumed of it
        self.pending: dict[str, list[pa.Table]] = {}  # impression window -> its held rows
        self._time_of: dict[str, int] = {}  # held event_id -> its impression's time
        self._held: dict[str, dict[str, _LabelEvent]] = {k: {} for k in self.labels}
        self._unmatched: dict[str, dict[str, _LabelEvent]] = {k: {} for k in self.labels}
        self._duplicates: list[tuple[int, str, str]] = []  # heap of (time, event_id, kind)
        self._windows = WindowCutter(pass_minutes)  # the pass id of a time, cached
        self.counters = JoinCounters()
        # kind -> offsets of the label events whose positives the last cut wrote
        self.used_offsets: dict[str, list[int]] = {}
        self.matured: pa.Table | None = None  # the last cut's matured rows
        self.open: dict[str, int] = {}  # label -> rows written, window open, at the last cut
        self.strays: list[Stray] = []  # new events to dead-letter, taken by the caller

    # -- time --------------------------------------------------------------------------

    def _horizon(self, window: str | None) -> int | None:
        if window is None:
            return None
        return window_ms(window, self._minutes)[1] + self.plan.cut_delay_ms

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
            start, end = window_ms(window, self._minutes)
            for d in delays:
                due |= {self._pass_of(start + d - cut), self._pass_of(end - 1 + d - cut)}
        if self._duplicates:
            due.add(self._pass_of(self._duplicates[0][0] - cut))
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
                self._attached(kind, event_id, event)

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

    def add_impressions(self, windows: list[str], table: pa.Table) -> None:
        """Hold a batch of impression rows (pass columns); ``windows[i]`` is row i's."""
        closed, replay_to = self.closed_through, self.replay_to.get(IMPRESSIONS, -1)
        time_of = self._time_of
        ids = table.column("event_id").to_pylist()
        times = table.column("event_time_ms").to_pylist()
        distinct_windows, fresh = set(windows), set(ids)
        if (
            (closed is None or min(distinct_windows) > closed)
            and len(fresh) == len(ids)
            and fresh.isdisjoint(time_of)
        ):  # the usual batch: nothing late, nothing repeated; no loop per row needed
            time_of.update(zip(ids, times, strict=True))
            self._claim_orphans(fresh)
            if len(distinct_windows) == 1:
                self.pending.setdefault(windows[0], []).append(table)
            else:
                labels = pa.array(windows)
                for window in sorted(distinct_windows):
                    part = table.filter(pc.equal(labels, window))
                    self.pending.setdefault(window, []).append(part)
            return
        groups: dict[str, list[int]] = {}
        offsets = table.column("kafka_offset").to_pylist()
        taken: set[str] = set()
        rows = zip(ids, windows, times, offsets, strict=True)
        for i, (event_id, window, time_ms, offset) in enumerate(rows):
            if event_id in time_of:
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
            part = table if len(group) == table.num_rows else table.take(group)
            self.pending.setdefault(window, []).append(part)

    def add_impression(self, window: str, row: dict[str, Any]) -> None:
        """Hold one impression row."""
        self.add_impressions([window], pa.Table.from_pylist([row]))

    def _stray(self, kind: str, event_id: str, event: _LabelEvent, reason: str) -> None:
        if self.labels[kind].dead_letter_strays or reason == "unattributed":
            self.strays.append(Stray(kind, event.offset, event_id, event.time_ms, reason))

    def _attached(self, kind: str, event_id: str, event: _LabelEvent) -> None:
        """A label event just joined its held impression: a positive its observed row will
        not carry is a duplicate due when it happened; one whose row (observed or
        duplicate) was already written when it was read is late."""
        label, imp_ms = self.labels[kind], self._time_of[event_id]
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
        event = _LabelEvent(time_ms, offset, self.is_replay(kind, offset))
        attached = event_id in self._time_of
        held = self._held[kind] if attached else self._unmatched[kind]
        first = held.get(event_id)
        if first is None:
            held[event_id] = event
            if attached:
                self._attached(kind, event_id, event)
            return
        # the earliest event labels the row; the resume keeps the lower offset of the two
        keep, drop = (event, first) if time_ms < first.time_ms else (first, event)
        kept = _LabelEvent(keep.time_ms, min(offset, first.offset), keep.replayed, first.late)
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
            w_start, w_end = window_ms(window, self._minutes)
            if w_end <= start_ms or w_start >= end_ms:
                continue
            parts = self.pending[window]
            table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            if start_ms <= w_start and w_end <= end_ms:
                pieces.append(table)
                if remove:
                    del self.pending[window]
                else:
                    self.pending[window] = [table]
                continue
            times = table["event_time_ms"]
            inside = pc.and_(pc.greater_equal(times, start_ms), pc.less(times, end_ms))
            pieces.append(table.filter(inside))
            rest = table.filter(pc.invert(inside)) if remove else table
            if rest.num_rows:
                self.pending[window] = [rest]
            else:
                del self.pending[window]
        pieces = [p for p in pieces if p.num_rows]
        if not pieces:
            return None
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]

    def close(self, window: str) -> pa.Table | None:
        """The rows due by ``window``'s horizon (None when there are none): observed rows,
        then duplicates; a delayed plan's matured rows are left in ``matured``. The window
        is closed from now on."""
        plan = self.plan
        start = NEVER if self.horizon_ms is None else self.horizon_ms
        horizon = self._horizon(window)
        assert horizon is not None
        self.closed_through, self.horizon_ms = window, horizon
        self.used_offsets, self.matured = {}, None
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
        if not rows:
            return None
        return pa.concat_tables(rows) if len(rows) > 1 else rows[0]

    def _events(self, kind: str, ids: list[str]) -> list[_LabelEvent | None]:
        held = self._held[kind]
        return [held.get(event_id) for event_id in ids]

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
        held = self._held[kind]
        used = self.used_offsets.setdefault(kind, [])
        used += [held[ids[i]].offset for i in np.flatnonzero(values == 1)]

    def _due_duplicates(self, horizon: int) -> pa.Table | None:
        """The duplicate positives due before ``horizon``, each a copy of its impression
        with its label 1 and every other label absent."""
        due: dict[str, list[tuple[int, str, str]]] = {}
        while self._duplicates and self._duplicates[0][0] < horizon:
            at, event_id, kind = heapq.heappop(self._duplicates)
            due.setdefault(self._pass_of(self._time_of[event_id]), []).append((at, event_id, kind))
        pieces = []
        for window, entries in due.items():
            parts = self.pending[window]
            table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            self.pending[window] = [table]
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
        self.used_offsets.setdefault(kind, []).extend(self._held[kind][e].offset for e in ids)
        return self._with_columns(table, columns)

    def _final(self, table: pa.Table) -> pa.Table:
        """The impressions' rows with their final labels: each label 1 iff its event came
        within its window; the impressions and their events are held no more. Late events
        and unattributed positives are counted (and dead-lettered) here, once."""
        ids = table.column("event_id").to_pylist()
        for event_id in ids:
            del self._time_of[event_id]
        if not self.labels:
            return table
        times = table.column("event_time_ms").to_numpy()
        columns: dict[str, np.ndarray] = {}
        events: dict[str, list[_LabelEvent | None]] = {}
        delays: dict[str, np.ndarray] = {}
        for kind, label in self.labels.items():
            held = self._held[kind]
            found = [held.pop(event_id, None) for event_id in ids]
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
                used = [e.offset for e in found if e is not None]
                if used:
                    self.used_offsets.setdefault(kind, []).extend(used)
        return self._with_columns(table, columns)

    def _open(self, horizon: int) -> dict[str, int]:
        """Per label written before its window closes: held impressions whose row is written
        and whose window for that label is still open at ``horizon``."""
        if not self.plan.delayed:
            return {}
        counts = {}
        tables = [t for parts in self.pending.values() for t in parts]
        for kind, label in self.labels.items():
            if label.emit == AFTER_WINDOW:
                continue
            start, end = horizon - label.window_ms, horizon - self.plan.delay_of(kind)
            counts[kind] = sum(
                int(
                    pc.sum(
                        pc.and_(
                            pc.greater_equal(t["event_time_ms"], start),
                            pc.less(t["event_time_ms"], end),
                        )
                    ).as_py()
                    or 0
                )
                for t in tables
            )
        return counts

    def take_counters(self) -> JoinCounters:
        """The counters since the last slice; they restart from zero."""
        counters, self.counters = self.counters, JoinCounters()
        return counters

    def take_strays(self) -> list[Stray]:
        """The label events to dead-letter found since the last call."""
        strays, self.strays = self.strays, []
        return strays

    def waiting(self) -> int:
        """Impressions held in memory for rows not yet written."""
        return sum(t.num_rows for tables in self.pending.values() for t in tables)

    def lowest_needed(self, kind: str) -> int | None:
        """Lowest offset of ``kind`` still held in memory (None: nothing held)."""
        if kind == IMPRESSIONS:
            offsets = [
                pc.min(t["kafka_offset"]).as_py() for ts in self.pending.values() for t in ts
            ]
        else:
            held = (*self._held[kind].values(), *self._unmatched[kind].values())
            offsets = [e.offset for e in held]
        return min(offsets, default=None)
