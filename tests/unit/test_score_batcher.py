"""The service's batcher on its own: requests waiting together are scored in one call, a
bad body is refused alone, a scoring failure reaches every request of its call. The
predictor is a small fake (pure logic: which rows reach which call)."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from serving_export.batcher import ScoreBatcher


class FakePredictor:
    """Two heads: x / 10 and x / 100."""

    schema = None
    tasks = ("click", "conversion")

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[float]] = []
        self.fail = fail

    def score_tasks(self, rows: list[dict]) -> np.ndarray:
        if self.fail:
            raise ConnectionError("store away")
        self.calls.append([r["x"] for r in rows])
        return np.array([[r["x"] / 10 for r in rows], [r["x"] / 100 for r in rows]])


def _heads(*xs: float) -> list[list]:
    return [[pytest.approx(x / 10) for x in xs], [pytest.approx(x / 100) for x in xs]]


def parse(body: bytes, _schema) -> tuple[list[dict], list]:
    payload = json.loads(body)
    if "bad" in payload:
        raise ValueError("bad body")
    return [{"x": x} for x in payload["xs"]], payload["xs"]


def _body(**payload) -> bytes:
    return json.dumps(payload).encode()


@pytest.mark.parametrize("offload", [False, True], ids=["on the loop", "on a thread"])
def test_waiting_requests_are_scored_in_one_call_each_gets_its_own_rows(offload: bool) -> None:
    async def run():
        batcher = ScoreBatcher(parse, 8, lambda e: RuntimeError(f"mapped: {e}"), offload)
        worker = asyncio.create_task(batcher.run())
        first, second = FakePredictor(), FakePredictor()
        requests = [
            batcher.score(first, _body(xs=[1, 2])),
            batcher.score(first, _body(bad=1)),
            batcher.score(second, _body(xs=[5])),  # another version: a call of its own
            batcher.score(first, _body(xs=[3])),
            batcher.score(FakePredictor(fail=True), _body(xs=[4])),
        ]
        results = await asyncio.gather(*requests, return_exceptions=True)
        worker.cancel()
        return results, first.calls, second.calls

    results, first_calls, second_calls = asyncio.run(run())
    assert results[0] == ([1, 2], _heads(1, 2))  # each request gets its rows of every head
    assert isinstance(results[1], ValueError)
    assert results[2] == ([5], _heads(5))
    assert results[3] == ([3], _heads(3))
    assert isinstance(results[4], RuntimeError) and "store away" in str(results[4])
    assert first_calls == [[1, 2, 3]] and second_calls == [[5]]


def test_at_most_max_requests_per_call() -> None:
    async def run():
        batcher = ScoreBatcher(parse, 2, lambda e: e)
        worker = asyncio.create_task(batcher.run())
        predictor = FakePredictor()
        await asyncio.gather(*(batcher.score(predictor, _body(xs=[i])) for i in range(5)))
        worker.cancel()
        return predictor.calls

    assert asyncio.run(run()) == [[0, 1], [2, 3], [4]]


def test_a_fault_in_a_batch_fails_its_requests_and_the_next_are_scored() -> None:
    class Broken(FakePredictor):
        def score_tasks(self, rows: list[dict]) -> list[float]:  # not an array: slicing fails
            return [0.0] * len(rows)

    async def run():
        batcher = ScoreBatcher(parse, 8, lambda e: e)
        worker = asyncio.create_task(batcher.run())
        broken = await asyncio.gather(
            batcher.score(Broken(), _body(xs=[1])), return_exceptions=True
        )
        after = await batcher.score(FakePredictor(), _body(xs=[2]))
        worker.cancel()
        return broken, after

    broken, after = asyncio.run(run())
    assert isinstance(broken[0], TypeError)
    assert after == ([2], _heads(2))


@pytest.mark.parametrize("offload", [False, True], ids=["on the loop", "on a thread"])
def test_what_was_scored_is_logged_after_its_answer_went_out(offload: bool) -> None:
    """The log is told of every scored row, after the request it answered has resumed (a
    slow or failing log costs no answer its time); a failing log fails no request."""
    events: list[str] = []

    def scored(_predictor, rows, ids, scores) -> None:
        events.append(f"logged {ids}")
        if ids == [9]:
            raise RuntimeError("the log's own fault")

    async def run():
        batcher = ScoreBatcher(parse, 8, lambda e: e, offload, scored)
        worker = asyncio.create_task(batcher.run())

        async def request(xs: list[int]) -> None:
            await batcher.score(FakePredictor(), _body(xs=xs))
            events.append(f"answered {xs}")

        await request([1, 2])
        await request([9])
        await asyncio.sleep(0.05)
        worker.cancel()

    asyncio.run(run())
    assert events == ["answered [1, 2]", "logged [1, 2]", "answered [9]", "logged [9]"]


def test_a_stop_refuses_what_waits_and_what_comes_after_and_answers_the_rest() -> None:
    """The stop's refusal (``serving_export.shutdown``): the batch being scored is
    answered, the requests still waiting and every later one get the refusal."""
    scoring, release = threading.Event(), threading.Event()

    class Slow(FakePredictor):
        def score_tasks(self, rows: list[dict]) -> np.ndarray:
            scoring.set()
            release.wait(10)
            return super().score_tasks(rows)

    async def run():
        batcher = ScoreBatcher(parse, 1, lambda e: e, offload=True)
        worker = asyncio.create_task(batcher.run())
        predictor = Slow()
        requests = [
            asyncio.ensure_future(batcher.score(predictor, _body(xs=[x]))) for x in range(4)
        ]
        while not scoring.is_set():  # the first request is on the scoring thread
            await asyncio.sleep(0.01)
        refused = batcher.refuse(RuntimeError("shutting down"))
        release.set()
        later = asyncio.ensure_future(batcher.score(predictor, _body(xs=[9])))
        outcomes = await asyncio.gather(*requests, later, return_exceptions=True)
        worker.cancel()
        return refused, outcomes

    refused, outcomes = asyncio.run(run())
    assert outcomes[0] == ([0], _heads(0))
    assert refused == 3
    assert [str(o) for o in outcomes[1:]] == ["shutting down"] * 4


def test_the_stop_clock_refuses_at_four_fifths_of_the_grace() -> None:
    from serving_export.shutdown import ANSWER_SHARE, StopClock

    async def run():
        stopping = False
        clock = StopClock(0.5, lambda: stopping)
        batcher = ScoreBatcher(parse, 8, lambda e: e)
        watching = asyncio.create_task(clock.watch(batcher, RuntimeError("stop")))
        await asyncio.sleep(0.2)
        assert clock.began is None and clock.left() == 0.5
        waiting = asyncio.ensure_future(batcher.score(FakePredictor(), _body(xs=[1])))
        stopping = True  # nothing scores it: it waits until the refusal
        await asyncio.sleep(0.5 * ANSWER_SHARE - 0.1)
        assert not waiting.done() and 0 < clock.left() < 0.5
        await watching
        assert clock.refused == 1 and clock.elapsed() >= 0.5 * ANSWER_SHARE
        return await asyncio.gather(waiting, return_exceptions=True)

    (outcome,) = asyncio.run(run())
    assert str(outcome) == "stop"


def test_one_call_scores_at_most_call_bytes_of_bodies() -> None:
    """Big requests are scored a few at a time, so the loop (and a stop) waits for one
    call at most; small ones still share a call, and a body larger than the bound alone."""
    from serving_export.batcher import CALL_BYTES

    async def run():
        batcher = ScoreBatcher(parse, 1000, lambda e: e)
        predictor = FakePredictor()
        pad = "x" * (CALL_BYTES // 3)
        big = [batcher.score(predictor, _body(xs=[i], pad=pad)) for i in range(5)]
        huge = batcher.score(predictor, _body(xs=[9], pad=pad * 4))
        small = [batcher.score(predictor, _body(xs=[i])) for i in range(20, 30)]
        worker = asyncio.create_task(batcher.run())
        await asyncio.gather(*big, huge, *small)
        worker.cancel()
        return predictor.calls

    assert asyncio.run(run()) == [[0, 1], [2, 3], [4], [9], list(range(20, 30))]
