"""Pure logic of the control plane: which ``stop`` commands a starting cluster obeys."""

from __future__ import annotations

import pytest

from streamrec.redis_keys import RedisKeys
from trainers.control_plane import Command, WorkerChannel

STARTED_MS = 1_700_000_000_000


@pytest.fixture
def channel() -> WorkerChannel:
    # no Redis: stale_stop reads only the command and the start time
    return WorkerChannel(None, RedisKeys("t"), 0, 1.0, started_ms=STARTED_MS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "sent_ms", "stale"),
    [
        ("stop", STARTED_MS - 1, True),  # sent to the run that was killed before reading it
        ("stop", STARTED_MS, False),
        ("stop", STARTED_MS + 5_000, False),  # sent to this run
        ("train", STARTED_MS - 60_000, False),  # queued work is resumed, never skipped
    ],
)
def test_only_a_stop_sent_before_the_start_is_stale(
    channel: WorkerChannel, kind: str, sent_ms: int, stale: bool
) -> None:
    command = Command("c1", kind, "", f"{sent_ms}-0")  # type: ignore[arg-type]
    assert channel.stale_stop(command) is stale


def test_a_cluster_started_without_a_start_time_obeys_every_stop() -> None:
    channel = WorkerChannel(None, RedisKeys("t"), 0, 1.0)  # type: ignore[arg-type]
    assert not channel.stale_stop(Command("c1", "stop", "", "1-0"))
