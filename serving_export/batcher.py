"""Scoring for ``streamrec serve``: the requests waiting at the same time, in one call.

A Paddle predictor run costs about the same for 1 row as for 16 (135 µs against 184 µs
measured here), so a service answering many small requests spends most of its scoring
time on per-call overhead. The batcher takes every admitted request waiting when it runs,
parses each body on its own (a bad one is refused alone), and scores the rows of the
requests made against the same version in one call. A lone request is scored at once:
nothing waits for a batch to fill.

With the in-process store it scores on the event loop itself: each batch holds the loop
for a fraction of a millisecond, then the loop reads what arrived meanwhile. A scoring
thread beside the loop has to win the GIL from it, and under overload the loop (reading
and refusing requests) keeps it: measured here at 4x capacity, 0.48 of capacity answered
with a scoring thread against 0.66 on the loop, admitted p99 131 ms against 86 ms. With
the Redis store, whose lookups wait on the network, it scores on one thread. What a
call scored reaches ``scored`` (the served log) only after its answers went out, one turn
of the loop later: logging adds nothing to a request's own latency.

One call takes the waiting requests up to ``CALL_BYTES`` of bodies (one at least): a
thousand batch-1 requests, or a few of a thousand events. The loop, and a stop
(``serving_export.shutdown``), waits for one call at most: 64 requests of 1,000 events
scored in one call held the loop 2.5 s here (issue 57).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving_export.predictor import Predictor

log = logging.getLogger(__name__)

CALL_BYTES = 1 << 20  # request bodies scored in one call, at most (one request at least)

Parse = Callable[[bytes, Any], tuple[list[dict[str, Any]], list[Any]]]
# told of every call's rows, event ids and scores ([tasks, rows]) once they are scored
Scored = Callable[[Predictor, list[dict[str, Any]], list[Any], np.ndarray], None]
# what one scoring call scored, for the log: its predictor, rows, event ids and scores
_Scoring = tuple[Predictor, list[dict[str, Any]], list[Any], np.ndarray]


@dataclass
class _Job:
    predictor: Predictor
    body: bytes
    future: asyncio.Future


class ScoreBatcher:
    """Scores waiting requests together, at most ``max_requests`` in one call.

    ``parse(body, schema)`` turns a body into feature rows and event ids or raises the
    request's own error; an error while scoring (the Redis sparse store away) is raised to
    every request of that call, mapped through ``scoring_error``. ``offload`` scores on a
    thread of its own: for a store whose lookups wait on the network, which must not hold
    the loop (and its probes) for as long as Redis takes to answer or time out.
    """

    def __init__(
        self,
        parse: Parse,
        max_requests: int,
        scoring_error: Callable[[Exception], BaseException],
        offload: bool = False,
        scored: Scored | None = None,
    ) -> None:
        self._parse = parse
        self._scored = scored
        self._offload = offload
        self._max_requests = max_requests
        self._scoring_error = scoring_error
        self._waiting: list[_Job] = []
        self._wake = asyncio.Event()
        self._refusal: BaseException | None = None

    async def score(self, predictor: Predictor, body: bytes) -> tuple[list[Any], list[list[float]]]:
        """The event ids and each task's probabilities (``predictor.tasks``' order) of one
        /predict body, scored by ``predictor`` (with whatever other requests wait beside
        it)."""
        if self._refusal is not None:
            raise self._refusal
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(_Job(predictor, body, future))
        self._wake.set()
        return await future

    def refuse(self, error: BaseException) -> int:
        """Fail every waiting request, and every later one, with ``error`` (the service is
        stopping); a batch being scored is still answered. How many were waiting."""
        self._refusal = error
        waiting, self._waiting = self._waiting, []
        refused = 0
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(error)
                refused += 1
        return refused

    async def run(self) -> None:
        """Score what waits, batch after batch, until cancelled."""
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="scorer") as scorer:
            while True:
                await self._wake.wait()
                jobs = self._take()
                if not self._waiting:
                    self._wake.clear()
                jobs = [j for j in jobs if not j.future.done()]  # a client that went away
                scored: list[_Scoring] = []
                try:
                    if self._offload:
                        outcomes = await loop.run_in_executor(scorer, self._score, jobs, scored)
                    else:
                        outcomes = self._score(jobs, scored)
                except Exception as e:  # a fault of this code: these fail, the next are scored
                    log.exception("scoring a batch of %d requests failed", len(jobs))
                    outcomes, scored = [e] * len(jobs), []
                for job, outcome in zip(jobs, outcomes, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        job.future.set_exception(outcome)
                    else:
                        job.future.set_result(outcome)
                if not self._offload or scored:
                    await asyncio.sleep(0)  # the answers go out, what arrived meanwhile is read
                self._log(scored)

    def _take(self) -> list[_Job]:
        """The waiting requests of the next call: at most ``max_requests``, and their bodies
        at most ``CALL_BYTES`` unless the first alone is larger."""
        taken, size = 0, 0
        for job in self._waiting[: self._max_requests]:
            if taken and size + len(job.body) > CALL_BYTES:
                break
            taken, size = taken + 1, size + len(job.body)
        jobs = self._waiting[:taken]
        del self._waiting[:taken]
        return jobs

    def _log(self, scored: list[_Scoring]) -> None:
        """Hand what was scored to ``scored`` (the served log), after the answers went out:
        logging costs no request its time. Never fails a request."""
        if self._scored is None:
            return
        for predictor, rows, ids, scores in scored:
            try:
                self._scored(predictor, rows, ids, scores)
            except Exception:  # a fault of the log's code: serving goes on
                log.exception("logging %d scored events failed", len(rows))

    def _score(self, jobs: list[_Job], scored: list[_Scoring]) -> list[Any]:
        """Each job's (ids, scores) or its error, in order, and what was scored (appended to
        ``scored`` for the log); on the scoring thread."""
        outcomes: list[Any] = [None] * len(jobs)
        by_predictor: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):  # a swap between requests: each is scored by the one it read
            by_predictor.setdefault(id(job.predictor), []).append(i)
        for group in by_predictor.values():
            parsed: list[tuple[int, list[dict[str, Any]], list[Any]]] = []
            for i in group:
                try:
                    rows, ids = self._parse(jobs[i].body, jobs[i].predictor.schema)
                except Exception as e:  # this request's own fault: refused alone
                    outcomes[i] = e
                    continue
                parsed.append((i, rows, ids))
            if not parsed:
                continue
            try:
                rows = [row for _, job_rows, _ in parsed for row in job_rows]
                predictor = jobs[parsed[0][0]].predictor
                scores = (
                    predictor.score_tasks(rows) if rows else np.zeros((len(predictor.tasks), 0))
                )
            except Exception as e:
                for i, _, _ in parsed:
                    outcomes[i] = self._scoring_error(e)
                continue
            start = 0
            for i, job_rows, ids in parsed:
                outcomes[i] = (ids, scores[:, start : start + len(job_rows)].tolist())
                start += len(job_rows)
            if self._scored is not None and rows:
                all_ids = [event_id for _, _, ids in parsed for event_id in ids]
                scored.append((predictor, rows, all_ids, scores))
        return outcomes
