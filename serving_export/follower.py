"""The version follower of ``streamrec serve``: it reads the registry's serving pointer
every ``serving.poll_seconds`` (and at once when the registry publishes a move), builds
the version it names (embeddings from the store, Paddle or ONNX predictors) off the
request path, and swaps one reference. A request reads that reference once, so it is
scored by exactly one version and never waits for a swap. A version that fails to load is
logged and counted; the old one keeps serving and the next poll tries again. With
``serving.canary_share`` / ``holdout_share`` it also keeps the registry's candidate and the
predecessor loaded, and ``ServingState.answering`` draws which version answers."""

from __future__ import annotations

import gc
import logging
import random
import socket
import threading
import time
from collections import deque
from contextlib import closing
from datetime import datetime

from serving_export.artifact import version_dir
from serving_export.manifest import ArtifactManifest
from serving_export.predictor import Predictor
from serving_export.registry import ModelRegistry
from serving_export.served_log import ServedLog
from serving_export.serving_metrics import ServingMetrics
from serving_export.sparse_store import InProcessStore, RedisStore
from streamrec.config import ServingConfig
from streamrec.contracts.registry import OnlineMetrics, ReplicaNote

log = logging.getLogger(__name__)


def window_end(manifest: ArtifactManifest) -> float:
    """Epoch seconds of the event-time end of a version's pass."""
    return datetime.fromisoformat(manifest.freshness.window_end).timestamp()


class ServingState:
    """The version serving now; replaced whole, never changed in place."""

    def __init__(self) -> None:
        self.current: Predictor | None = None
        # with serving.holdout_share: the version that served before the current one
        self.held: Predictor | None = None
        # with serving.canary_share: the candidate, not serving yet
        self.canary: Predictor | None = None
        self.served_at: str | None = None  # when the registry made it serve
        # (version, just before, just after its swap): a request that read the reference
        # between two swaps was scored by the version between them
        self.swaps: deque[tuple[str, float, float]] = deque(maxlen=100)

    def swap(self, predictor: Predictor, served_at: str | None) -> None:
        before = time.time()
        self.current, self.served_at = predictor, served_at
        self.swaps.append((predictor.version, before, time.time()))

    def answering(self, canary_share: float, holdout_share: float) -> Predictor | None:
        """The version that answers a request, drawn at random: the candidate for a
        ``canary_share`` of requests, the held-out predecessor for a ``holdout_share``
        (each where one is loaded), the current version for the rest."""
        draw = random.random()
        canary, held = self.canary, self.held
        if canary is not None and draw < canary_share:
            return canary
        if held is not None and canary_share <= draw < canary_share + holdout_share:
            return held
        return self.current


class VersionFollower:
    """Follows the registry's serving pointer and swaps versions in."""

    def __init__(
        self,
        registry: ModelRegistry,
        store: InProcessStore | RedisStore,
        state: ServingState,
        metrics: ServingMetrics,
        cfg: ServingConfig,
        replica: str,
        served_log: ServedLog | None = None,
    ) -> None:
        self._registry = registry
        self._replica = replica
        self._served_log = served_log
        self._noted: ReplicaNote | None = None
        self._store = store
        self._state = state
        self._metrics = metrics
        self._cfg = cfg
        self._stop = threading.Event()
        self._moved = threading.Event()  # the registry published a move: read it now
        self._thread = threading.Thread(target=self._run, name="version-follower", daemon=True)
        self._listener = threading.Thread(target=self._listen, name="registry-moves", daemon=True)
        self._failed: str | None = None
        self._held_for: str | None = None  # the serving version the held one was chosen for
        # the online metrics (ops.online) of the versions answering, as last recorded
        self.online: list[OnlineMetrics] = []

    def start(self) -> None:
        self._thread.start()
        self._listener.start()

    def stop(self, timeout_s: float = 10) -> None:
        """Stop following; wait for the thread at most ``timeout_s`` (a daemon: a load
        still running ends with the process)."""
        self._stop.set()
        self._moved.set()
        self._thread.join(timeout=timeout_s)

    def poll_once(self) -> None:
        """Load the pointer's version if it is not the one serving (and, with a holdout
        share, the version before it)."""
        version = self._registry.serving_version()
        current, canary = self._state.current, self._state.canary  # before the candidate moves
        if self._cfg.canary_share > 0:
            self._follow_candidate()
        if version is None or (current is not None and current.version == version):
            if current is not None and self._cfg.holdout_share > 0:
                self._hold(current.version)
            return
        started = time.perf_counter()
        try:  # a candidate promoted is loaded already
            predictor = canary if canary and canary.version == version else self._load(version)
        except Exception as e:  # a bad version must not stop the one serving
            self._metrics.load_failures.inc()
            if self._failed != version:
                log.error(
                    "cannot load version %s, %s keeps serving: %s",
                    version,
                    current.version if current else "nothing",
                    e,
                )
            self._failed = version
            return
        served_at = self._registry.manifest(version).freshness.served_at
        if self._cfg.holdout_share > 0:  # the one swapped out is most often the predecessor
            self._state.held = current
        self._state.swap(predictor, served_at)
        # the loaded version's objects live until the next swap: out of the collector's
        # sight, a full collection does not walk them (measured: 50-150 ms stalls of every
        # request and probe under load before, none after)
        gc.freeze()
        self._failed = None
        seconds = time.perf_counter() - started
        self._metrics.swaps.inc()
        self._metrics.load_seconds.set(seconds)
        self._metrics.version.clear()
        self._metrics.version.labels(version).set(1)
        log.info(
            "serving %s (was %s), built in %.3f s",
            version,
            current.version if current else "nothing",
            seconds,
        )

    def _load(self, version: str) -> Predictor:
        return Predictor(
            version_dir(self._store.model_dir, version),
            self._store.embeddings_for(version),
            self._cfg.threads,
            self._cfg.runtime,
        )

    def _follow_candidate(self) -> None:
        """Load the registry's candidate to answer the canary share (drop it once gone);
        one that cannot be loaded is logged once and answers nothing."""
        wanted = self._registry.candidate()
        canary = self._state.canary
        if wanted is None or (canary is not None and canary.version == wanted):
            if wanted is None:
                self._state.canary = None
            return
        if wanted == self._failed:
            return
        try:
            self._state.canary = self._load(wanted)
            share = 100 * self._cfg.canary_share
            log.info("candidate %s answers %.1f%% of requests", wanted, share)
        except Exception as e:
            log.error("cannot load candidate %s; it answers nothing: %s", wanted, e)
            self._state.canary = None
            self._failed = wanted

    def _hold(self, version: str) -> None:
        """Keep the version that served before ``version`` answering the holdout share; a
        version that cannot be loaded is logged once and the current one answers all.
        Looked up once per serving version: the registry's history is not read each poll."""
        if self._held_for == version:
            return
        self._held_for = version
        wanted = self._registry.predecessor(version)
        held = self._state.held
        if held is not None and held.version == wanted:
            return
        if wanted is None or wanted == self._failed:
            self._state.held = None
            return
        try:
            self._state.held = self._load(wanted)
            share = 100 * self._cfg.holdout_share
            log.info("%s answers %.1f%% of requests beside %s", wanted, share, version)
        except Exception as e:
            log.error(
                "cannot load %s for the holdout share; %s answers all: %s", wanted, version, e
            )
            self._state.held = None
            self._failed = wanted

    def note(self) -> None:
        """Tell the registry what this replica serves (``streamrec status`` lists it): at
        once when a version answering changed, else often enough to keep the note alive;
        and read the answering versions' online metrics for ``/metrics``."""
        current, swaps = self._state.current, self._state.swaps
        version = current.version if current else None
        now = time.time()
        ttl_s = max(10.0, 5 * self._cfg.poll_seconds)
        noted = self._noted
        held, canary = self._state.held, self._state.canary
        answering = (version, held and held.version, canary and canary.version)
        if (
            noted is not None
            and (noted.version, noted.held, noted.canary) == answering
            and now - noted.noted_at < ttl_s / 3
        ):
            return
        loaded_at = swaps[-1][2] if swaps else None
        logged = self._served_log.counts() if self._served_log else None
        note = ReplicaNote(
            replica=self._replica,
            host=socket.gethostname(),
            version=version,
            loaded_at=loaded_at,
            noted_at=now,
            logged=logged.logged if logged else None,
            unlogged=logged.unlogged if logged else None,
            held=held.version if held else None,
            canary=canary.version if canary else None,
        )
        self._registry.note_replica(note, ttl_s)
        self._noted = note
        shown = [p.version for p in (current, held, canary) if p is not None]
        self.online = [m for v in shown for m in self._registry.online(v)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.note()
            except Exception:  # Redis away: keep serving what is loaded, try again
                log.exception("reading the serving pointer failed")
            self._moved.wait(self._cfg.poll_seconds)
            self._moved.clear()

    def _listen(self) -> None:
        """Wake the follower at each move the registry publishes, so a new version loads at
        once rather than at the next poll (on average half ``serving.poll_seconds`` later)."""
        while not self._stop.is_set():
            try:
                with closing(self._registry.moves()) as moves:
                    while not self._stop.is_set():
                        if moves.get_message(timeout=1.0) is not None:
                            self._moved.set()
            except Exception:  # Redis away: the polls go on; subscribe again
                log.warning("the registry's moves are not heard: polling only", exc_info=True)
                self._stop.wait(self._cfg.poll_seconds)
