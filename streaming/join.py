"""Per-partition join state: impressions wait for their labels' windows, label events attach.

Pure logic on Arrow tables and plain values (no Kafka, no files), so it is tested directly. One
``PartitionJoin`` owns partition ``p`` of the impressions topic and partition ``p`` of each
joined label's topic (the clicks, the conversions; all keyed by ``event_id``, so they are
co-partitioned). Labels the impression carries itself arrive with it.

    impression (window W)  -> pending[W]                      (late if W is already closed)
    label event            -> attached to its pending impression (first event wins;
                              repeats are duplicates), else held as unmatched until expired
    close(W)               -> rows of W, each joined label 1 iff its event came within that
                              label's window of the impression (later ones count as late);
                              a positive whose row lacks the label it ``requires`` is
                              unattributed: kept, or trained as 0 and dead-lettered

Every row waits for the longest window (the builder cuts W only then), so a row is written
once with every label that came in time: no correction is ever needed. State is never
persisted on its own. It is rebuilt by replaying the topics from the newest slice's
``resume_offsets`` (the lowest offsets still needed). What is decided when an event is read
(malformed, duplicate) or expires (unmatched) was counted in a slice if the event lies below
that slice's ``consumed_to``, and is not counted (or dead-lettered) again; what is decided
when a window closes (late, unattributed) concerns a row still pending, so no slice has
counted it yet, however early its label event was read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IMPRESSIONS = "impressions"


@dataclass(frozen=True)
class JoinedLabel:
    """What the join needs of a label joined from its own topic."""

    kind: str  # the label's name; also the kind of its topic
    column: str  # its pass column
    window_ms: int
    requires: str | None = None  # the pass column of the label a positive implies
    keep_unattributed: bool = False
    dead_letter_strays: bool = False


@dataclass
class _LabelEvent:
    time_ms: int
    offset: int
    replayed: bool


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

    late: int = 0  # later than the label's window after their impression
    duplicate: int = 0  # further events for an impression already labelled
    unmatched: int = 0  # events whose impression is not pending (written or unseen)
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
    ) -> None:
        self.labels = {label.kind: label for label in labels}
        self.closed_through = closed_through
        self.replay_to = replay_to  # topic kind -> consumed_to of the newest slice
        self.pending: dict[str, list[pa.Table]] = {}  # window -> its buffered rows
        self._window_of: dict[str, str] = {}  # event_id -> window
        self._held: dict[str, dict[str, _LabelEvent]] = {k: {} for k in self.labels}
        self._unmatched: dict[str, dict[str, _LabelEvent]] = {k: {} for k in self.labels}
        self.counters = JoinCounters()
        # kind -> offsets of the label events that labelled the last closed window
        self.used_offsets: dict[str, list[int]] = {}
        self.strays: list[Stray] = []  # new events to dead-letter, taken by the caller

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
                self._held[kind][event_id] = unmatched.pop(event_id)

    def add_impressions(self, windows: list[str], table: pa.Table) -> None:
        """Buffer a batch of impression rows (pass columns); ``windows[i]`` is row i's."""
        closed, replay_to = self.closed_through, self.replay_to.get(IMPRESSIONS, -1)
        window_of = self._window_of
        ids = table.column("event_id").to_pylist()
        distinct_windows, fresh = set(windows), set(ids)
        if (
            (closed is None or min(distinct_windows) > closed)
            and len(fresh) == len(ids)
            and fresh.isdisjoint(window_of)
        ):  # the usual batch: nothing late, nothing repeated; no loop per row needed
            window_of.update(zip(ids, windows, strict=True))
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
        for i, (event_id, window, offset) in enumerate(zip(ids, windows, offsets, strict=True)):
            if closed is not None and window <= closed:
                if offset >= replay_to:
                    self.counters.late_impressions += 1
                continue
            if event_id in window_of:
                continue  # the same impression twice (a producer retry without idempotence)
            window_of[event_id] = window
            taken.add(event_id)
            groups.setdefault(window, []).append(i)
        self._claim_orphans(taken)
        for window, rows in groups.items():
            part = table if len(rows) == table.num_rows else table.take(rows)
            self.pending.setdefault(window, []).append(part)

    def add_impression(self, window: str, row: dict[str, Any]) -> None:
        """Buffer one impression row."""
        self.add_impressions([window], pa.Table.from_pylist([row]))

    def _stray(self, kind: str, event_id: str, event: _LabelEvent, reason: str) -> None:
        if self.labels[kind].dead_letter_strays or reason == "unattributed":
            self.strays.append(Stray(kind, event.offset, event_id, event.time_ms, reason))

    def add_label(self, kind: str, event_id: str, time_ms: int, offset: int) -> None:
        """Attach a label event of ``kind`` to its pending impression, or hold it until it
        expires."""
        event = _LabelEvent(time_ms, offset, self.is_replay(kind, offset))
        held = self._held[kind] if event_id in self._window_of else self._unmatched[kind]
        first = held.get(event_id)
        if first is None:
            held[event_id] = event
            return
        # the earliest event labels the row; the resume keeps the lower offset of the two
        keep, drop = (event, first) if time_ms < first.time_ms else (first, event)
        held[event_id] = _LabelEvent(keep.time_ms, min(offset, first.offset), keep.replayed)
        if not event.replayed:
            self.counters.of(kind).duplicate += 1
            self._stray(kind, event_id, drop, "duplicate")

    def expire_unmatched(self, watermark_ms: int) -> None:
        """Drop held label events no pending impression can claim any more; count the new
        ones."""
        for kind, unmatched in self._unmatched.items():
            window_ms = self.labels[kind].window_ms
            for event_id, event in list(unmatched.items()):
                if event.time_ms + window_ms < watermark_ms:
                    del unmatched[event_id]
                    if not event.replayed:
                        self.counters.of(kind).unmatched += 1
                        self._stray(kind, event_id, event, "unmatched")

    def close(self, window: str) -> pa.Table | None:
        """The labelled rows of ``window`` (None when it has none); it is closed from now on."""
        parts = self.pending.pop(window, [])
        self.used_offsets = {}
        self.closed_through = window
        if not parts:
            return None
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        ids = table.column("event_id").to_pylist()
        for event_id in ids:
            del self._window_of[event_id]
        if not self.labels:
            return table
        times = table.column("event_time_ms").to_numpy()
        columns: dict[str, np.ndarray] = {}
        events: dict[str, list[_LabelEvent | None]] = {}
        for kind, label in self.labels.items():
            held = self._held[kind]
            found = [held.pop(event_id, None) for event_id in ids]
            values = np.zeros(len(ids), dtype=np.int8)
            for i, event in enumerate(found):
                if event is None:
                    continue
                self.used_offsets.setdefault(kind, []).append(event.offset)
                if event.time_ms - times[i] <= label.window_ms:
                    values[i] = 1
                else:  # a pending row's fate is new even if its event was read before
                    self.counters.of(kind).late += 1
                    self._stray(kind, ids[i], event, "late")
            columns[label.column], events[kind] = values, found
        for kind, label in self.labels.items():
            if label.requires is None:
                continue
            required = columns.get(label.requires)
            if required is None:
                required = table.column(label.requires).to_numpy()
            values = columns[label.column]
            for i in np.flatnonzero((values == 1) & (required == 0)):
                event = events[kind][i]
                assert event is not None  # a positive has its event
                self.counters.of(kind).unattributed += 1
                if not label.keep_unattributed:
                    values[i] = 0
                    self._stray(kind, ids[i], event, "unattributed")
        for column, values in columns.items():
            index = table.schema.get_field_index(column)
            table = table.set_column(index, column, pa.array(values, pa.int8()))
        return table

    def take_counters(self) -> JoinCounters:
        """The counters since the last slice; they restart from zero."""
        counters, self.counters = self.counters, JoinCounters()
        return counters

    def take_strays(self) -> list[Stray]:
        """The label events to dead-letter found since the last call."""
        strays, self.strays = self.strays, []
        return strays

    def waiting(self) -> int:
        """Impressions held in memory for windows not yet cut."""
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
