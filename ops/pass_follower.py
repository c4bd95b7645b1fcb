"""The cluster follows the passes (``cluster.follow_passes``): each pass is trained the
moment it is complete, judged, and delivered off the training path.

    pass N steps published (passes.step_seconds) -> train_steps: scored and trained, unsaved
    pass N complete -> train N (progressive metrics, the durable save) -> gate N
      -> after a day's last pass: the cluster's maintenance and retention, before N+1
      -> passed, and no later pass complete: export N (the model as it stands), then
         publish and deliver N on the delivery thread while N+1 trains
      -> passed, a later pass complete: N is superseded by the next pass exported (as a
         catch-up does: the model moves past N before it could be exported)

The gate of N+1 waits for N's delivery, so each pass is judged against the model that
serves after its predecessor, as a DAG run after its predecessor's is.

One follower leads at a time: every ``streamrec cluster`` node runs one, and the holder of
a Redis lease (redis-py's ``Lock``) follows; another takes over when its lease lapses.
Every step is idempotent per pass (the commands' done markers, the stored gate decision,
the registry), so a follower that takes over in the middle of a pass repeats nothing that
finished. A step that fails is retried with backoff and never skipped, as a DAG run's
failure holds the later runs. The Airflow DAG watches each pass instead of driving it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import redis
from redis.exceptions import LockError

from ops import pass_sequence
from ops.catchup import next_pass
from ops.status import pass_finished
from serving_export import delivery
from streamrec.config import PipelineConfig
from streamrec.contracts.catch_up import Superseded
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.pass_status import PassField, read_status, record
from streamrec.errors import StreamrecError
from streamrec.passes import is_complete, pass_dir, published_step_names
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import restore_chain
from trainers.control_plane import ClusterClient

log = logging.getLogger(__name__)

# how often the next pass is looked for (``next_pass``: a stat of its donefile, else a
# listing of the day's passes, which finds a pass after a gap), and between those how often
# the next window's donefile alone is: at 0.1 s alone it added 0.05 s on average to every
# pass's path to serving; the waiting loop costs 0.8% of a core at 25 ms (1.4% at 10 ms)
POLL_S, STAT_S = 0.1, 0.025
LEASE_S = 15.0  # a follower whose process died is replaced this long after
RETRY_S = (1.0, 30.0)  # backoff of a failed step: the first wait and the longest
JOIN_S = 2.0  # at shutdown: the thread is a daemon and its steps idempotent, so no longer
RETRIED = (StreamrecError, redis.RedisError, OSError)
T = TypeVar("T")


def trained_head(cfg: PipelineConfig) -> str | None:
    """The newest pass the model has trained through: its newest durable save's."""
    chain = restore_chain(Path(cfg.paths.checkpoint_root))
    return chain[-1].pass_id if chain else None


class PassFollower:
    """Trains, judges and delivers each pass as it completes, while ``stop`` is not set."""

    def __init__(self, cfg: PipelineConfig, stop: threading.Event, owner: str) -> None:
        self.cfg = cfg
        self.stop = stop
        self.client = ClusterClient.from_config(cfg)
        self._r = connect(cfg.redis)
        self._keys = RedisKeys(cfg.name)
        # not thread-local: the lease is taken here and renewed on its own thread
        self._lease = self._r.lock(
            self._keys.pass_follower, timeout=LEASE_S, blocking=False, thread_local=False
        )
        self._lost = threading.Event()
        self._owner = owner
        self._deliveries = ThreadPoolExecutor(1, thread_name_prefix="deliver")
        self._delivering: Future[None] | None = None
        self._waiting: list[str] = []  # passed the gate, not exported: superseded next
        self._stepped: tuple[str | None, set[str]] = (None, set())  # window, steps sent

    def run(self) -> None:
        """Lead while holding the lease, else wait for it, until ``stop``. A defect in a
        step is logged and the lead taken again after the longest backoff: the cluster
        beside it keeps running, and the DAG flags the pass that waits."""
        try:
            while not self.stop.is_set():
                if self._retried("take the lease", self._take_lease, leading=False):
                    log.info("pass follower on %s leads", self._owner)
                    try:
                        self._lead()
                    except Exception:
                        log.exception("pass follower on %s failed; leading again", self._owner)
                        self.stop.wait(RETRY_S[1])
                    finally:
                        self._lost.set()  # ends the renewal
                        self._release()
                self.stop.wait(LEASE_S / 3)
        finally:
            self._deliveries.shutdown(wait=True)

    @property
    def leads(self) -> bool:
        """Whether this follower holds the lease now."""
        return bool(self._lease.owned())

    def _take_lease(self) -> bool:
        if not self._lease.acquire():
            return False
        self._lost.clear()
        threading.Thread(target=self._keep_lease, name="follower-lease", daemon=True).start()
        return True

    def _keep_lease(self) -> None:
        """Renew the lease every third of its life, through any long command; a renewal
        that fails (Redis away longer than the lease) gives up the lead."""
        while not self._lost.wait(LEASE_S / 3) and not self.stop.is_set():
            try:
                self._lease.reacquire()
            except (redis.RedisError, LockError) as e:
                log.warning("pass follower on %s lost its lease: %s", self._owner, e)
                self._lost.set()

    def give_up_lead(self) -> None:
        """Stop renewing and release the lease, at shutdown: the next follower leads at
        once, not a lease later (a step still running has stopped being the leader's)."""
        self._lost.set()
        self._release()

    def _release(self) -> None:
        # lapsed, or taken by another follower since: nothing to give back
        with suppress(redis.RedisError, LockError):
            self._lease.release()

    def _lead(self) -> None:
        head = self._retried("read the newest checkpoint", lambda: trained_head(self.cfg))
        if head is not None and not self._finished(head):
            self._follow(head)  # a lead lost after its training: the steps after it
        while not self.stop.is_set() and not self._lost.is_set():
            nxt = next_pass(self.cfg, head)
            if nxt is None:
                self._watch_next_window(head)
                continue
            if self._follow(nxt) is None:
                return  # stopped, or the lead lost
            head = nxt
        self._join_delivery()

    def _watch_next_window(self, head: str | None) -> None:
        """Wait up to ``POLL_S``, returning early once the window after ``head`` is a
        complete pass; then train the steps of that window published since."""
        window = self.cfg.passes.clock.next(head) if head is not None else None
        deadline = time.monotonic() + POLL_S
        while not self.stop.wait(STAT_S) and time.monotonic() < deadline:
            if window is not None and is_complete(pass_dir(self.cfg.paths.data_root, window)):
                return
        if window is not None and self.cfg.passes.step_seconds:
            self._train_steps(window)

    def _train_steps(self, window: str) -> None:
        """Train the steps of the open pass ``window`` published and not yet sent. The
        workers skip a step they trained; one they lost (the cluster restarted) is trained
        by the pass's own command."""
        if self._stepped[0] != window:
            self._stepped = (window, set())
        sent = self._stepped[1]
        new = tuple(
            s for s in published_step_names(self.cfg.paths.data_root, window) if s not in sent
        )
        if not new:
            return
        trained = self._retried(
            f"train the steps {new} of {window}", lambda: self.client.train_steps(window, new)
        )
        if trained is not None:
            sent.update(new)

    def _finished(self, pass_id: str) -> bool:
        status = read_status(self._r, self._keys, pass_id)
        return pass_finished(status, delivery.registry_for(self.cfg).serving_version())

    def _follow(self, pass_id: str) -> GateDecision | None:
        """Every step of one complete pass up to its export; its delivery is left running.
        None once stopped or no longer leading."""
        trained = self._retried(f"train {pass_id}", lambda: self.client.train(pass_id))
        if trained is None:
            return None
        self._join_delivery()
        decision = self._retried(f"judge {pass_id}", lambda: delivery.evaluate(self.cfg, trained))
        ended = self._retried(
            f"end the day after {pass_id}",
            lambda: pass_sequence.day_end(self.cfg, self.client, pass_id),
        )
        if decision is None or ended is None:
            return None
        if decision.passed and next_pass(self.cfg, pass_id) is not None:
            self._waiting.append(pass_id)  # the next pass is complete: it exports for both
            return decision
        self._supersede(pass_id, decision.passed)
        if decision.passed:
            export = self._retried(f"export {pass_id}", lambda: self.client.export(pass_id))
            if export is None:
                return None
            self._delivering = self._deliveries.submit(
                self._deliver, pass_id, export.raw_export, decision
            )
        return decision

    def _supersede(self, newest: str, delivers: bool) -> None:
        """Mark the passes waiting for an export as superseded by ``newest``."""
        if not self._waiting:
            return
        superseded = Superseded(by=newest, delivers=delivers)

        def mark() -> None:
            pipe = self._r.pipeline(transaction=True)
            for older in self._waiting:
                record(pipe, self._keys, older, PassField.SUPERSEDED, superseded)
            pipe.execute()

        self._retried(f"mark {self._waiting} superseded by {newest}", mark)
        self._waiting = []

    def _deliver(self, pass_id: str, raw_export: str, decision: GateDecision) -> None:
        def publish_and_deliver() -> None:
            version = delivery.publish(self.cfg, raw_export, decision).version
            delivery.deliver(self.cfg, version)

        self._retried(f"deliver {pass_id}", publish_and_deliver)

    def _join_delivery(self) -> None:
        if self._delivering is not None:
            delivering, self._delivering = self._delivering, None
            delivering.result()

    def _retried(self, what: str, step: Callable[[], T], leading: bool = True) -> T | None:
        """``step``'s result, retried with backoff until it succeeds; None once stopped, or
        once the lead is lost when the step is one of the leader's (another follower leads
        then, and repeats what this one left)."""
        wait = RETRY_S[0]
        while not self.stop.is_set() and not (leading and self._lost.is_set()):
            try:
                return step()
            except RETRIED as e:
                log.error("pass follower: could not %s (retry in %.0f s): %s", what, wait, e)
                self.stop.wait(wait)
                wait = min(wait * 2, RETRY_S[1])
        return None


@contextmanager
def following(cfg: PipelineConfig, owner: str) -> Iterator[None]:
    """A pass follower on a thread for as long as the block runs, when
    ``cluster.follow_passes`` asks for one; nothing otherwise."""
    if not cfg.cluster.follow_passes:
        yield
        return
    stop = threading.Event()
    follower = PassFollower(cfg, stop, owner)
    thread = threading.Thread(target=follower.run, name="pass-follower", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=JOIN_S)  # within the service manager's grace, after the agent's
        follower.give_up_lead()
