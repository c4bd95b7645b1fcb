"""Per-partition join state: impressions wait for their label window, clicks attach to them.

Pure logic on plain values (no Kafka, no files), so it is tested directly. One
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

    def add_impression(self, window: str, row: dict[str, Any]) -> None:
        """Buffer an impression row (with ``kafka_offset``) for ``window``."""
        if self.closed_through is not None and window <= self.closed_through:
            if not self.is_replay("impressions", row["kafka_offset"]):
                self.counters.late_impressions += 1
            return
        event_id = row["event_id"]
        if event_id in self._window_of:
            return  # the same impression twice (producer retry without idempotence)
        self.pending.setdefault(window, {})[event_id] = row
        self._window_of[event_id] = window
        orphan = self._unmatched.pop(event_id, None)
        if orphan is not None:
            self._clicks[event_id] = orphan

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

    def close(self, window: str) -> list[dict[str, Any]]:
        """The labelled rows of ``window``; the window is closed from now on."""
        rows = list(self.pending.pop(window, {}).values())
        self.used_click_offsets = []
        for row in rows:
            event_id = row["event_id"]
            del self._window_of[event_id]
            click = self._clicks.pop(event_id, None)
            if not self.click_join:
                continue
            if click is not None:
                self.used_click_offsets.append(click.offset)
            delay = None if click is None else click.time_ms - row["event_time_ms"]
            row["label"] = int(delay is not None and delay <= self.label_window_ms)
            if delay is not None and delay > self.label_window_ms and not click.replayed:
                self.counters.late_clicks += 1
        self.closed_through = window
        return rows

    def take_counters(self) -> JoinCounters:
        """The counters since the last slice; they restart from zero."""
        counters, self.counters = self.counters, JoinCounters()
        return counters

    def lowest_needed(self, kind: str) -> int | None:
        """Lowest offset of ``kind`` still held in memory (None: nothing held)."""
        if kind == "impressions":
            offsets = [r["kafka_offset"] for rows in self.pending.values() for r in rows.values()]
        else:
            offsets = [c.offset for c in (*self._clicks.values(), *self._unmatched.values())]
        return min(offsets, default=None)
