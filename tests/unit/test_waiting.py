"""The one wait helper every streamrec wait runs on."""

from __future__ import annotations

import time

import pytest

from streamrec.waiting import poll_until


def test_returns_the_first_answer_even_a_falsy_one() -> None:
    answers = iter([None, None, {}])  # an empty result is an answer (a command's "{}")
    assert poll_until(lambda: next(answers), timeout_s=5, interval_s=0.001) == {}


def test_none_after_the_deadline_with_a_last_check_at_or_after_it() -> None:
    calls: list[float] = []
    started = time.monotonic()

    def never() -> None:
        calls.append(time.monotonic())

    assert poll_until(never, timeout_s=0.2, interval_s=0.05) is None
    assert calls[-1] - started >= 0.2 and len(calls) >= 4
    assert time.monotonic() - started < 1.0


def test_a_failure_the_check_raises_ends_the_wait() -> None:
    def exited() -> None:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        poll_until(exited, timeout_s=5, interval_s=0.01)
