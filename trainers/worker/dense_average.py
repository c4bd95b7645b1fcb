"""The dense parameters the servers keep after a pass: the mean of the pass's iterates.

The last iterate of a pass is a noisy point: on the Criteo replay (1,000-row passes) the
model as it stood after each pass put the next pass's COPC anywhere from 0.77 to 1.45,
while the training run's own predictions, made by the iterates along the pass, stayed
calibrated. Averaging the iterates (Polyak-Ruppert averaging, restarted every pass) cut that
spread to 0.85 to 1.22 over ten runs, at the same AUC (docs/decisions/).

Each worker adds up the dense parameters its scope holds after every training batch (a
``py_func`` appended to the training program; in async mode the scope is its pull thread's
latest copy of the servers' tables). After the pass the sums are all-reduced, and worker 0
writes their mean into the servers' tables, which the checkpoint, the export and the next
pass then read. Sparse embeddings are not averaged: they live only on the servers.

A fresh model's first pass keeps its last iterate: the model still moves fast from its
random start and the mean of the pass lags far behind it. On the 2-pass synthetic readers
test, averaging the first pass put the second pass's AUC at 0.62, 0.56 and 0.72 where the
last iterate gave 0.74 to 0.75 in the same batch of runs (docs/decisions/).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from streamrec.contracts.training import DenseAverage
from trainers.worker import dense_tables

log = logging.getLogger(__name__)


class IterateAverage:
    """One worker's running sum of the dense parameters after each training batch."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self._shapes = shapes
        self._lock = threading.Lock()  # reader threads run the py_func concurrently
        self._sums = {n: np.zeros(s) for n, s in shapes.items()}
        self.batches = 0
        self.training = False

    def begin(self) -> None:
        """Start summing: the training run of one pass starts."""
        with self._lock:
            for total in self._sums.values():
                total.fill(0.0)
            self.batches, self.training = 0, True

    def hold(self) -> None:
        """Stop summing while a read only scores (its program runs the op too)."""
        self.training = False

    def resume(self) -> None:
        """Sum on: a later training read of a pass trained in steps."""
        self.training = True

    def after_batch(self) -> None:
        """The py_func: add the scope's dense parameters (scoring runs the op too: skip)."""
        if not self.training:
            return
        import paddle

        scope = paddle.static.global_scope()
        with self._lock:
            for name, total in self._sums.items():
                total += np.array(scope.find_var(name).get_tensor())
            self.batches += 1

    def apply(self, leader_only: Callable[[Callable[[], None]], object]) -> DenseAverage:
        """Every worker, after its training run: the mean over every worker's batches goes
        into the servers' dense tables (written by worker 0 through ``leader_only``) and
        into every worker's scope; the number of batches averaged and the scope's digest."""
        from paddle.distributed import fleet

        self.training = False
        names = sorted(self._sums)
        flat = np.concatenate([self._sums[n].ravel() for n in names] + [[self.batches]])
        total = np.asarray(fleet.util.all_reduce(flat, "sum"), dtype=np.float64)
        batches = int(total[-1])
        if not batches:
            return DenseAverage(batches=0, dense_digest=dense_tables.digest())
        mean, start = {}, 0
        for name in names:
            size = int(np.prod(self._shapes[name]))
            mean[name] = (total[start : start + size] / batches).reshape(self._shapes[name])
            start += size

        def write() -> None:
            dense_tables.settle()  # the pass's last gradients land first, then are replaced
            dense_tables.push(mean)

        leader_only(write)
        dense_tables.pull()
        return DenseAverage(batches=batches, dense_digest=dense_tables.digest())


def install(loss: Any) -> IterateAverage:
    """Worker side, after ``fleet.init_worker()``: append the per-batch sum to the training
    program (after ``loss``'s backward, sends and any sync round)."""
    import paddle

    average = IterateAverage({n: v.shape for n, v in dense_tables.pull().items()})

    # a plain function: py_func maps the op's inputs onto the callable's named arguments
    def after_batch(loss: Any) -> None:
        average.after_batch()

    paddle.static.py_func(func=after_batch, x=[loss], out=None)
    return average
