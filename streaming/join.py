"""Per-partition join state: impressions wait for their label window, clicks attach to them.

Pure logic on Arrow tables and plain values (no Kafka, no files), so it is tested directly. One
``PartitionJoin`` owns partition ``p`` of the impressions topic and, in ``click_join`` mode,
partition ``p`` of the clicks topic (both keyed by ``event_id``, so they are co-partitioned).

    impression (window W)  -> pending[W]                      (late if W is already closed)
    click                  -> attached to its pending impression (first click wins;
                              repeats are duplicates), else held as unmatched until expired
    close(W)               -> rows of W, labelled: 1 iff a click came within
                              label_window of the impression (later clicks count as late)

State is never persisted on its own. It is rebuilt by replaying the topics from the
newest slice's ``resume_offsets`` (the lowest offsets still needed); events below that
slice's ``consumed_to`` that belong to closed windows were accounted for before and are
skipped without being counted again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class _Click:
    time_ms: int
    offset: int
    replayed: bool


@dataclass
class JoinCounters:
    """What happened to events since the last slice of this partition."""

    late_impressions: int = 0  # impressions for windows already closed
    late_clicks: int = 0  # clicks later than label_window after their impression
    duplicate_clicks: int = 0  # further clicks on an impression already clicked
    unmatched_clicks: int = 0  # clicks whose impression is not pending (written or unseen)
    malformed: Counter[str] = field(default_factory=Counter)

    def as_fields(self) -> dict[str, Any]:
        return {
            "late": self.late_impressions,
            "late_clicks": self.late_clicks,
            "duplicate_clicks": self.duplicate_clicks,
            "unmatched_clicks": self.unmatched_clicks,
            "malformed": dict(self.malformed),
        }


class PartitionJoin:
    """Impressions and clicks of one partition, between two slices."""

    def __init__(
        self,
        *,
        click_join: bool,
        label_window_ms: int,
        closed_through: str | None,
        replay_to: dict[str, int],
    ) -> None:
        self.click_join = click_join
        self.label_window_ms = label_window_ms
        self.closed_through = closed_through
        self.replay_to = replay_to  # topic kind -> consumed_to of the newest slice
        self.pending: dict[str, dict[str, dict[str, Any]]] = {}  # window -> event_id -> row
        self._window_of: dict[str, str] = {}  # event_id -> window
        self._clicks: dict[str, _Click] = {}  # event_id -> first click
        self._unmatched: dict[str, _Click] = {}
        self.counters = JoinCounters()
        self.used_click_offsets: list[int] = []  # clicks that labelled the last closed window

    def is_replay(self, kind: str, offset: int) -> bool:
        return offset < self.replay_to.get(kind, -1)

    def malformed(self, kind: str, offset: int, reason: str) -> bool:
        """Count a malformed event unless it is a replay; True when it is new."""
        if self.is_replay(kind, offset):
            return False
        self.counters.malformed[reason] += 1
        return True

    def add_impressions(self, windows: list[str], table: pa.Table) -> None:
        """Buffer a batch of impression rows (pass columns); ``windows[i]`` is row i's."""
        closed, replay_to = self.closed_through, self.replay_to.get("impressions", -1)
        window_of, unmatched = self._window_of, self._unmatched
        ids = table.column("event_id").to_pylist()
        distinct_windows, fresh = set(windows), set(ids)
        if (
            (closed is None or min(distinct_windows) > closed)
            and len(fresh) == len(ids)
            and fresh.isdisjoint(window_of)
        ):  # the usual batch: nothing late, nothing repeated; no loop per row needed
            window_of.update(zip(ids, windows, strict=True))
            for event_id in fresh.intersection(unmatched) if unmatched else ():
                self._clicks[event_id] = unmatched.pop(event_id)
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
        for i, (event_id, window, offset) in enumerate(zip(ids, windows, offsets, strict=True)):
            if closed is not None and window <= closed:
                if offset >= replay_to:
                    self.counters.late_impressions += 1
                continue
            if event_id in window_of:
                continue  # the same impression twice (a producer retry without idempotence)
            window_of[event_id] = window
            if unmatched and (orphan := unmatched.pop(event_id, None)) is not None:
                self._clicks[event_id] = orphan
            groups.setdefault(window, []).append(i)
        for window, rows in groups.items():
            part = table if len(rows) == table.num_rows else table.take(rows)
            self.pending.setdefault(window, []).append(part)

    def add_impression(self, window: str, row: dict[str, Any]) -> None:
        """Buffer one impression row."""
        self.add_impressions([window], pa.Table.from_pylist([row]))

    def add_click(self, event_id: str, time_ms: int, offset: int) -> None:
        """Attach a click to its pending impression, or hold it until it expires."""
        replayed = self.is_replay("clicks", offset)
        held = self._clicks if event_id in self._window_of else self._unmatched
        first = held.get(event_id)
        if first is not None:
            if not replayed:
                self.counters.duplicate_clicks += 1
            if time_ms < first.time_ms:
                held[event_id] = _Click(time_ms, min(offset, first.offset), replayed)
            return
        held[event_id] = _Click(time_ms, offset, replayed)

    def expire_unmatched(self, watermark_ms: int) -> None:
        """Drop held clicks no pending impression can claim any more; count the new ones."""
        for event_id, click in list(self._unmatched.items()):
            if click.time_ms + self.label_window_ms < watermark_ms:
                del self._unmatched[event_id]
                if not click.replayed:
                    self.counters.unmatched_clicks += 1

    def close(self, window: str) -> pa.Table | None:
        """The labelled rows of ``window`` (None when it has none); it is closed from now on."""
        parts = self.pending.pop(window, [])
        self.used_click_offsets = []
        self.closed_through = window
        if not parts:
            return None
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        ids = table.column("event_id").to_pylist()
        for event_id in ids:
            del self._window_of[event_id]
        if not self.click_join:
            return table
        labels = []
        for event_id, time_ms in zip(ids, table.column("event_time_ms").to_pylist(), strict=True):
            click = self._clicks.pop(event_id, None)
            if click is None:
                labels.append(0)
                continue
            self.used_click_offsets.append(click.offset)
            delay = click.time_ms - time_ms
            labels.append(int(delay <= self.label_window_ms))
            if delay > self.label_window_ms and not click.replayed:
                self.counters.late_clicks += 1
        index = table.schema.get_field_index("label")
        return table.set_column(index, "label", pa.array(labels, table.schema.field(index).type))

    def take_counters(self) -> JoinCounters:
        """The counters since the last slice; they restart from zero."""
        counters, self.counters = self.counters, JoinCounters()
        return counters

    def lowest_needed(self, kind: str) -> int | None:
        """Lowest offset of ``kind`` still held in memory (None: nothing held)."""
        if kind == "impressions":
            offsets = [
                pc.min(t["kafka_offset"]).as_py() for ts in self.pending.values() for t in ts
            ]
        else:
            offsets = [c.offset for c in (*self._clicks.values(), *self._unmatched.values())]
        return min(offsets, default=None)
