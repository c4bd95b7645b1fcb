"""Synchronous dense updates on Paddle 2.6.2's parameter server (``runner.sync_mode: sync``).

In sync mode the servers' dense tables only collect the workers' gradients; they apply
their average when every worker has reached the barrier table (``MemoryDenseTable::Pour``
from ``BarrierTable::Barrier``). Paddle's own driver of those barriers, the
``SyncCommunicator``, is never built by 2.6.2's runtime (the program's ``send_barrier`` op
then calls a null communicator and segfaults), and when built and started it waits forever
for a ``Send`` that the dense ``send`` ops no longer make. So this module

- builds the SYNC communicator without starting it: ``send_barrier`` finds an instance (a
  no-op while it is not running) and the worker's ``barrier`` reaches the barrier table;
- appends one ``py_func`` op to the end of the training program, after the ``send`` ops:
  every batch, it joins one round (below) once its gradients are sent, and pulls the
  updated dense tables into the scope, so every worker's next batch sees the same weights.

A round is a gloo all-reduce of "still training" followed by one barrier-table barrier.
Workers rarely hold the same number of batches; one that has run out keeps joining rounds
(``finish``) until no worker trains, so each round has every worker in it. The all-reduce
also keeps a fast worker from re-entering the barrier before a slow one has woken from it
(the barrier table's wait would then never see an empty set). Sparse tables are pushed as
in async mode: Paddle's sync covers the dense part only.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from streamrec.contracts import training
from trainers.worker import dense_tables

log = logging.getLogger(__name__)

# the barrier type that makes the servers apply (Pour) the collected dense gradients
_POUR = 0


class RoundKeeper:
    """Round keeping for one worker: the py_func's callable and the counts of a run."""

    def __init__(self, communicator: Any) -> None:
        self._communicator = communicator  # Paddle's singleton must outlive the training
        self.training = False
        self.batches = 0  # rounds joined with a batch of its own
        self.idle = 0  # rounds joined after this worker's data ran out
        self.dense_digest = ""  # sha256 of the dense weights after the last run

    def begin(self) -> None:
        """Count rounds from here: the training run of one pass starts."""
        self.training, self.batches, self.idle = True, 0, 0

    def finish(self) -> None:
        """After this worker's training run: join rounds until no worker has batches left."""
        self.training = False
        while _round(still_training=False):
            self.idle += 1
        self.dense_digest = dense_tables.digest()

    def summary(self) -> training.SyncRounds:
        """The last run's rounds, with and without a batch, and the dense weights' digest."""
        return training.SyncRounds(
            rounds=self.batches + self.idle,
            batches=self.batches,
            idle=self.idle,
            dense_digest=self.dense_digest,
        )

    def after_batch(self, loss: Any) -> None:
        """The py_func: a round after each training batch (scoring keeps the op: skip)."""
        if self.training:
            _round(still_training=True)
            self.batches += 1


def install(loss: Any) -> RoundKeeper:
    """Worker side, after ``fleet.init_worker()``: build the unstarted SYNC communicator
    and append the per-batch round to the training program (after ``loss``'s backward and
    sends)."""
    import paddle
    from google.protobuf import text_format
    from paddle.distributed.communicator import Communicator
    from paddle.distributed.fleet import fleet as fleet_instance
    from paddle.distributed.ps.utils.public import DistributedMode, get_the_one_recv_context

    runtime = fleet_instance._runtime_handle
    trainer = runtime.context["trainer"]
    if trainer.mode != DistributedMode.SYNC:
        raise RuntimeError(f"the fleet strategy is not sync (mode {trainer.mode})")
    role = runtime.role_maker
    kwargs = {
        "need_global_step": "0",
        "trainer_id": role._worker_index(),
        "trainers": role._worker_num(),
        "barrier_table_id": runtime.ps_desc_builder.barrier_table_id,
        "pserver_endpoints": role._get_pserver_endpoints(),
    }
    communicator = Communicator(trainer.mode, kwargs, trainer.get_communicator_flags())
    # no send contexts: the dense sends go through FleetWrapper, never through it
    communicator.init_with_ctx(
        {},
        get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode),
        text_format.MessageToString(runtime.ps_desc_builder.ps_desc),
        runtime.string_hosts,
        paddle.static.global_scope(),
    )
    rounds = RoundKeeper(communicator)
    # a plain function: py_func maps the op's inputs onto the callable's named arguments,
    # and would count a bound method's ``self`` among them

    def after_batch(loss: Any) -> None:
        rounds.after_batch(loss)

    paddle.static.py_func(func=after_batch, x=[loss], out=None)
    log.info("sync mode: dense updates wait for every worker after each batch")
    return rounds


def _round(still_training: bool) -> bool:
    """One round; False (and no barrier) once every worker's data has run out."""
    from paddle.distributed import fleet
    from paddle.distributed.fleet import fleet as fleet_instance

    runtime = fleet_instance._runtime_handle
    if not fleet.util.all_reduce(np.array([int(still_training)]), "max")[0]:
        return False
    runtime._worker.barrier(_POUR)
    dense_tables.pull()
    return True
