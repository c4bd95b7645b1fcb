"""The worker's context for every command step, and the collectives the steps agree by.

A worker builds one ``WorkerContext`` at start (its config, model graph, executor, rank,
the checkpoint chain its model is in) and hands it to each step; ``leader_only`` runs a
step on worker 0 with every worker waiting, ``agree_any`` is an all-reduce of a flag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from streamrec.config import PipelineConfig
from trainers.checkpoints import CheckpointInfo, ModelSignature
from trainers.models import ModelGraph
from trainers.worker.dense_average import IterateAverage
from trainers.worker.sync_mode import RoundKeeper

if TYPE_CHECKING:
    from trainers.worker.open_pass import OpenPass

T = TypeVar("T")


@dataclass
class WorkerContext:
    """Everything a worker's steps need, built once at start."""

    cfg: PipelineConfig
    graph: ModelGraph
    exe: Any
    rank: int
    workers: int
    scoring: Any  # the forward-only program reads that only score run (``scoring_program``)
    signature: ModelSignature  # what every save records of the model (``warm_start``)
    # the stage and how long it may block heartbeats, e.g. into the worker's heartbeat
    report: Callable[[str, float], None] = lambda stage, hold_s: None
    chain: list[CheckpointInfo] = field(default_factory=list)  # the saves the model is in
    table_keys: np.ndarray = field(  # worker 0: keys in the sparse table, from the saves
        default_factory=lambda: np.empty(0, dtype=np.uint64)
    )
    sync: RoundKeeper | None = None  # sync mode: the per-batch rounds (``sync_mode``)
    average: IterateAverage | None = None  # dense_average: pass (``dense_average``)
    open_pass: OpenPass | None = None  # the pass its steps are training (``open_pass``)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @contextmanager
    def stage(self, name: str, seconds: dict[str, float], blocking: bool = False) -> Iterator[None]:
        """Report the stage ``name`` and record its wall time (seconds) in ``seconds``.
        ``blocking``: a call on the whole table that holds the GIL until it returns (a
        save, a shrink), so the heartbeat sent now must outlive it (``blocking_hold_s``)."""
        self.report(name, blocking_hold_s(self.table_size()) if blocking else 0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds[name] = round(time.perf_counter() - start, 3)

    def table_size(self) -> int:
        """Keys in the sparse table as of the newest save (0 for a fresh model)."""
        return self.chain[-1].table_keys if self.chain else 0

    def leader_only(self, step: Callable[[], T]) -> T | None:
        """Run ``step`` on worker 0 only, then wait for it on every worker (an all-reduce);
        if it raised, every worker raises. An exception must not let worker 0 skip the
        collective the others are waiting in: the cluster would hang."""
        error: Exception | None = None
        value = None
        if self.leader:
            try:
                value = step()
            except Exception as e:  # re-raised below, once every worker knows
                error = e
        failed = agree_any(error is not None)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError("worker 0 failed this step; its log has the cause")
        return value


# Measured on bench/scale.py's tables (2 cores): a base save takes 6.4 s per million keys
# and heartbeats stop for all of it; a delta of 2M new keys 5-12 s. The hold is five
# times that, so a heartbeat outlives the call on a busier or slower machine.
BLOCKING_S_PER_MILLION_KEYS = 30.0


BLOCKING_S_MIN = 60.0


def blocking_hold_s(table_keys: int) -> float:
    """How long a heartbeat sent before a blocking call on a table of ``table_keys`` keys
    must live: the client waits that long before it calls the cluster gone."""
    return BLOCKING_S_MIN + BLOCKING_S_PER_MILLION_KEYS * table_keys / 1e6


def agree_any(flag: bool) -> bool:
    """True on every worker if ``flag`` is true on any worker (a gloo all-reduce)."""
    from paddle.distributed import fleet

    return bool(fleet.util.all_reduce(np.array([int(flag)]), "max")[0])
