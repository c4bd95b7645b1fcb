"""Event-time windows and when to cut them: pure code, no Kafka, no files, no clock.

A partition's **watermark** is the event time up to which it has seen everything: the
oldest of its topics' newest event times, less ``passes.allowed_lateness_seconds``. A topic
is left out of the minimum only while it is idle (caught up with the broker and quiet for
``idle_partition_seconds``: the caller knows that, this module is told); when every topic
of the partition is idle, the newest event time of any owned partition stands in, so a
quiet partition still closes its windows.

A window is **complete** once its end, plus the label window in ``click_join`` mode, is at
or below the watermark. Complete windows are cut in order, each once, none skipped: the
empty windows between two with data are cut too (an empty slice says "nothing happened
here"), except a run longer than ``max_gap_passes``, which is an outlier timestamp rather
than a quiet stream and is jumped over.

``PassBuilder`` keeps the state (newest times, pending and closed windows) and does the
I/O; tests/unit/test_windows.py drives this module with any interleaving of partitions,
late and duplicate events.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from streamrec.passes import PassClock


def watermark_ms(
    newest_ms: Mapping[str, int],
    topics: Iterable[str],
    idle: Collection[str],
    fallback_ms: int,
    lateness_ms: int,
) -> int:
    """A partition's watermark from its topics' newest event times (``newest_ms``, a topic
    that sent nothing yet counts as 0: the partition waits for it), leaving out the
    ``idle`` topics; ``fallback_ms`` (the newest time of any partition) when all are."""
    active = [newest_ms.get(topic, 0) for topic in topics if topic not in idle]
    return (min(active) if active else fallback_ms) - lateness_ms


@dataclass
class WindowCutter:
    """Which pass window an event time falls in, and which windows a watermark completes."""

    clock: PassClock
    label_delay_ms: int = 0  # click_join: a window waits for its label window too
    max_gap_passes: int = 1_000_000
    _ids: dict[int, str] = field(default_factory=dict, repr=False)  # window number -> id

    @property
    def width_ms(self) -> int:
        """One window's length in milliseconds."""
        return self.clock.width_ms

    def pass_id_of(self, event_ms: int) -> str:
        """The id of the window holding ``event_ms`` (epoch ms, UTC)."""
        number = event_ms // self.width_ms
        pass_id = self._ids.get(number)
        if pass_id is None:
            pass_id = self._ids[number] = self.clock.id_at(number * self.width_ms)
        return pass_id

    def pass_ids_of(self, times: np.ndarray) -> list[str]:
        """The window ids of an array of event times (each distinct window formatted once)."""
        numbers = times // self.width_ms
        ids = {int(n): self.pass_id_of(int(n) * self.width_ms) for n in np.unique(numbers)}
        return [ids[n] for n in numbers.tolist()]

    def is_complete(self, window: str, watermark: int) -> bool:
        """True once ``window`` (and its label window) ends at or below ``watermark``."""
        return self.clock.window(window)[1] + self.label_delay_ms <= watermark

    def to_cut(
        self, candidates: Collection[str], closed_through: str | None, watermark: int
    ) -> list[str]:
        """The windows to cut now, oldest first: from the one after ``closed_through`` (the
        oldest candidate when nothing is closed yet) through the newest complete candidate,
        every window between, runs of more than ``max_gap_passes`` empty windows jumped.
        ``candidates`` are the windows with data here or a slice elsewhere."""
        ready = [w for w in candidates if (closed_through is None or w > closed_through)]
        complete = [w for w in ready if self.is_complete(w, watermark)]
        if not complete:
            return []
        newest = max(complete)
        window = min(ready) if closed_through is None else self.clock.next(closed_through)
        cut = []
        while window <= newest:
            window = self._over_long_gap(window, ready)
            cut.append(window)
            window = self.clock.next(window)
        return cut

    def _over_long_gap(self, window: str, ready: Collection[str]) -> str:
        """``window``, or the next window with data when more than ``max_gap_passes`` empty
        windows lie between."""
        if window in ready:
            return window
        following = min(w for w in ready if w > window)
        start = self.clock.window(window)[0]
        gap = (self.clock.window(following)[0] - start) // self.width_ms
        return following if gap > self.max_gap_passes else window
