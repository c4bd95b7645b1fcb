"""Catching up a backlog: the complete passes after a run's own, trained in the same run.

After an outage every missed window has its DAG run, and each run pays Airflow's whole
per-run cost: seven task processes, 6.0 s a pass against 2.0 s of training
(``bench/catchup.py``). While behind, the run catching up trains, after its own pass, every
pass already complete after it, oldest first (at most ``schedule.catchup_passes``), and
gives each the steps its own run would: training (progressive metrics, checkpoint), the
gate decision stored on the pass, and after a day's last pass the cluster's maintenance
and retention. Each is marked ``caught_up`` on its status, and its own run's sensor then
skips that run. Only the newest pass trained is exported and delivered, if it passes the
gate: the model has moved past the older ones, and the export is of the model as it stands.
So a run that is behind does not export its own pass (``deferred_to``); the passes it
trained and did not deliver (its own first) are marked ``superseded`` by the newest.
A window still pending ends the catch-up: passes are trained in order, none skipped.
"""

from __future__ import annotations

import logging
import time

from ops import pass_sequence
from serving_export.delivery import evaluate
from streaming.slices import slice_pass_ids
from streamrec.config import PipelineConfig
from streamrec.contracts.catch_up import CatchUp, CaughtUp, Superseded
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.pass_status import PassField, read_status, record
from streamrec.passes import complete_passes, is_complete, pass_dir
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import ClusterClient

log = logging.getLogger(__name__)


def next_pass(cfg: PipelineConfig, head: str | None) -> str | None:
    """The complete pass to train after ``head`` (None: a fresh model, which starts at
    ``schedule.start`` when there is one), once every window between them will never have a
    pass; None while a pass is pending before it, or none is complete."""
    clock, data_root = cfg.passes.clock, cfg.paths.data_root
    window = clock.next(head) if head is not None else None
    if window is not None and is_complete(pass_dir(data_root, window)):
        return window  # the common case, one stat: no folder listing
    if window is None and cfg.schedule is not None:
        window = clock.id_of(cfg.schedule.start)
    later = complete_passes(data_root, since=window)
    if not later:
        return None
    # a window between that a partition wrote a slice of will come; one nothing wrote never
    # will, since a later pass is complete (``passes.pass_state``)
    if window is not None and any(window <= p < later[0] for p in slice_pass_ids(data_root)):
        return None
    return later[0]


def deferred_to(cfg: PipelineConfig, pass_id: str) -> str | None:
    """The pass this run's catch-up will train after ``pass_id``, when there is one: the
    run then leaves its own pass to be superseded instead of exporting it."""
    if cfg.schedule is None or cfg.schedule.catchup_passes == 0:
        return None
    return next_pass(cfg, pass_id)


def caught_up_by(cfg: PipelineConfig, pass_id: str) -> CaughtUp | None:
    """Which run's catch-up trained ``pass_id`` (and when), or None: also while a catch-up
    has only claimed it, so a run whose catch-up failed (and was then marked done by hand)
    leaves the pass to its own run."""
    status = read_status(connect(cfg.redis), RedisKeys(cfg.name), pass_id)
    return status.caught_up if status.trained else None


def catch_up(cfg: PipelineConfig, pass_id: str, decision: GateDecision) -> CatchUp:
    """Train the backlog after ``pass_id`` (trained, judged and maintained by its own run,
    with ``decision``); the newest pass trained and its decision.

    A pass is marked as this run's before it is trained, so a retry of the run carries on
    through it; a pass trained otherwise (its own run, or another run's catch-up: this run
    was cleared and runs again) ends the catch-up, as the backlog is not this run's."""
    client = ClusterClient.from_config(cfg)
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    trained: list[str] = []
    newest = pass_id
    limit = cfg.schedule.catchup_passes if cfg.schedule is not None else 0
    while len(trained) < limit and (nxt := next_pass(cfg, newest)) is not None:
        status = client.pass_status(nxt)
        claimed = status.caught_up.by_run_of if status.caught_up else None
        if status.trained and claimed != pass_id:
            break
        record(r, keys, nxt, PassField.CAUGHT_UP, CaughtUp(by_run_of=pass_id, at=time.time()))
        decision = evaluate(cfg, client.train(nxt))
        pass_sequence.day_end(cfg, client, nxt)
        trained.append(nxt)
        newest = nxt
    if trained:
        # the passes this run trained before the newest are never exported (nor its own,
        # unless it was delivered before the backlog came): the newest is, if it passes the
        # gate (``ops.status.pass_finished``)
        superseded = Superseded(by=newest, delivers=decision.passed)
        own = [] if client.pass_status(pass_id).delivered else [pass_id]
        pipe = r.pipeline(transaction=True)
        for older in [*own, *trained[:-1]]:
            record(pipe, keys, older, PassField.SUPERSEDED, superseded)
        pipe.execute()
        log.info("caught up %d passes after %s, to %s", len(trained), pass_id, newest)
    return CatchUp(pass_id=newest, trained=tuple(trained), decision=decision)
