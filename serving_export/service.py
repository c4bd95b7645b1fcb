"""The online predictor service: ``streamrec serve``.

    POST /predict   {"events": [{"event_id"?, "sparse": {...}, "dense": {...}}, ...]}
                    -> {"version", "p_click": [...], "event_ids": [...]}
    GET  /healthz   the process answers
    GET  /readyz    200 once a verified version is loaded, 503 before
                    (both answered on the event loop at once, never behind the admission
                    bound or the predictions waiting to be scored)
    GET  /version   what serves: version, network and runtime, its freshness, sparse kind,
                    and this host's name
    GET  /metrics   Prometheus text

With ``serving.bearer_token_env`` (or ``_file``) set, /predict and /version answer 401
unless the request carries ``Authorization: Bearer <token>``; the probes and the metrics
stay open for the orchestrator and the scraper.

FastAPI on uvicorn: the ASGI stack the Python serving ecosystem runs on (and the one
Airflow already brings).

Past ``serving.max_in_flight`` predictions in flight, /predict answers a fast 503
"overloaded" with Retry-After (``admission.py``), so the latency of the admitted ones stays
bounded whatever the number of clients. The requests waiting are scored together in one
predictor call (``batcher.py``): one core here answered 9,700 batch-1 requests a second
from 64 connections, against 2,300 when each request was scored alone.

A follower thread reads the registry's serving pointer every ``serving.poll_seconds``;
when it names another version (a delivery or a rollback) the thread builds that version's
``Predictor`` (embeddings from the store, Paddle predictors) off the request path and
swaps one reference. A request reads that reference once, so it is scored by exactly one
version and never waits for a swap. A version that fails to load is logged and counted;
the old one keeps serving and the next poll tries again.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hmac
import json
import logging
import math
import random
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serving_export.admission import AdmissionLimit
from serving_export.artifact import version_dir
from serving_export.batcher import ScoreBatcher
from serving_export.manifest import ArtifactManifest
from serving_export.predictor import Predictor
from serving_export.registry import ModelRegistry
from serving_export.served_log import ServedLog, now_ms, served_records
from serving_export.shutdown import StopClock
from serving_export.sparse_store import InProcessStore, RedisStore
from streaming.errors import MalformedEvent
from streaming.events import scoring_row
from streamrec.config import EMBEDDED, SchemaConfig, ServingConfig, derived, load_config
from streamrec.contracts.registry import OnlineMetrics, ReplicaNote
from streamrec.entry import run_command
from streamrec.errors import ConfigError, ServiceError
from streamrec.redis_conn import require_credentials

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


class ServingMetrics:
    """The service's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "streamrec_serving_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "streamrec_serving_predict_seconds",
            "Time to answer /predict.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.events = Counter("streamrec_serving_events", "Events scored.", registry=r)
        self.overloaded = Counter(
            "streamrec_serving_overloaded",
            "/predict requests refused with 503 because serving.max_in_flight were in flight.",
            registry=r,
        )
        self.in_flight = Gauge(
            "streamrec_serving_in_flight",
            "/predict requests admitted and not answered yet.",
            registry=r,
        )
        self.version = Gauge(
            "streamrec_serving_version", "1 for the version serving now.", ["version"], registry=r
        )
        self.version_age = Gauge(
            "streamrec_serving_version_age_seconds",
            "Now minus the event-time end of the serving version's pass (its freshness).",
            registry=r,
        )
        self.swaps = Counter("streamrec_serving_swaps", "Versions swapped in.", registry=r)
        self.load_failures = Counter(
            "streamrec_serving_load_failures", "Versions that failed to load.", registry=r
        )
        self.load_seconds = Gauge(
            "streamrec_serving_load_seconds", "Time the last swap took to build.", registry=r
        )


class _LogCollector(Collector):
    """The served log's counts, read when /metrics is scraped."""

    def __init__(self, served_log: ServedLog) -> None:
        self._log = served_log

    def collect(self) -> Iterator[Metric]:
        counts = self._log.counts()
        yield CounterMetricFamily(
            "streamrec_serving_logged", "Served events logged to Kafka.", value=counts.logged
        )
        yield CounterMetricFamily(
            "streamrec_serving_unlogged",
            "Served events not logged: no room while Kafka was slow or away, or refused.",
            value=counts.unlogged,
        )
        yield GaugeMetricFamily(
            "streamrec_serving_log_backlog", "Served events waiting to be logged.", counts.backlog
        )


class _OnlineCollector(Collector):
    """Each answering version's online metrics (AUC, logloss, COPC and the labelled events
    they are over, per task), as ``streamrec online`` last recorded them."""

    def __init__(self, follower: VersionFollower) -> None:
        self._follower = follower

    def collect(self) -> Iterator[Metric]:
        families = {
            name: GaugeMetricFamily(f"streamrec_online_{name}", help_, labels=["version", "task"])
            for name, help_ in (
                ("auc", "Online AUC of a version on the labelled events it answered."),
                ("logloss", "Online logloss of a version on the labelled events it answered."),
                ("copc", "Online clicks over predicted clicks of a version."),
                ("events", "Labelled events a version's online metrics are over."),
            )
        }
        for m in self._follower.online:
            labels = [m.version, m.task]
            families["events"].add_metric(labels, m.count)
            for name, value in (("auc", m.auc), ("logloss", m.logloss), ("copc", m.copc)):
                if value is not None:
                    families[name].add_metric(labels, value)
        yield from families.values()


class _GateCollector(Collector):
    """The serving version's gate evidence per task: its progressive AUC, or with labels
    written before their window closed both the matured one (final labels) and the fresh
    one (the labels trained with), named by the ``labels`` label."""

    def __init__(self, state: ServingState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "streamrec_serving_gate_auc",
            "AUC the gate delivered the serving version on, per task; labels: matured (final "
            "labels, the newest matured pass) or fresh (labels trained with), else progressive.",
            labels=["version", "task", "labels"],
        )
        current = self._state.current
        gate = current.manifest.metrics.gate if current is not None else None
        if current is not None and gate is not None:
            main = current.manifest.feature_schema.labels[0].name
            fresh = gate.fresh_auc is not None
            kind = "matured" if fresh else "progressive"
            for task, auc in {main: gate.auc, **gate.task_aucs}.items():
                if math.isfinite(auc):
                    family.add_metric([current.version, task, kind], auc)
            if fresh:
                assert gate.fresh_auc is not None
                for task, auc in {main: gate.fresh_auc, **gate.fresh_task_aucs}.items():
                    family.add_metric([current.version, task, "fresh"], auc)
        yield family


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


def _error(code: int, reason: str, detail: str = "") -> JSONResponse:
    return JSONResponse({"error": reason, "detail": detail}, status_code=code)


class RequestRejected(Exception):
    def __init__(self, code: int, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.response = _error(code, reason, detail)


class Unauthorized(RequestRejected):
    """A guarded endpoint's request without the serving token (RFC 6750's 401)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(401, "unauthorized", "send Authorization: Bearer <token>")
        self.endpoint = endpoint
        self.response.headers["WWW-Authenticate"] = "Bearer"


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestRejected(413, "body_too_large", f"the body must be at most {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestRejected(413, "body_too_large", f"the body must be at most {limit} bytes")
    return bytes(body)


def parse_request(
    body: bytes, schema: SchemaConfig, max_events: int, assign_ids: bool = False
) -> tuple[list, list]:
    """Feature rows and event ids of a /predict body; RequestRejected with the reason.
    ``assign_ids``: an event without a usable event_id gets a fresh one (the served log
    keys every event by its id)."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RequestRejected(400, "bad_json", str(e)[:200]) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
        raise RequestRejected(422, "bad_request", 'the body must be {"events": [...]}')
    events = payload["events"]
    if len(events) > max_events:
        raise RequestRejected(413, "too_many_events", f"at most {max_events} events per request")
    rows, ids = [], []
    for i, event in enumerate(events):
        try:
            rows.append(scoring_row(event, schema))
        except MalformedEvent as e:
            raise RequestRejected(422, e.reason, f"events[{i}]: {e.detail}") from None
        event_id = event.get("event_id")
        if not isinstance(event_id, str | int):
            event_id = uuid.uuid4().hex if assign_ids else None
        ids.append(event_id)
    return rows, ids


# our own 401 (its body, its count in the metrics), not FastAPI's automatic 403
_BEARER = HTTPBearer(auto_error=False)


def token_guard(token: str | None, endpoint: str):
    """A FastAPI dependency: ``Unauthorized`` for ``endpoint`` unless the request's bearer
    credentials are ``token`` (no guard when ``token`` is None)."""

    # async: a sync dependency would cost every request a trip to the thread pool
    async def guard(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials is not None else ""
        # constant time: the comparison must not tell how much of a guess was right
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized(endpoint)

    return guard


def create_app(
    cfg: ServingConfig,
    registry: ModelRegistry,
    store: InProcessStore | RedisStore,
    replica: str | None = None,
    served_log: ServedLog | None = None,
    clock: StopClock | None = None,
) -> AdmissionLimit:
    """The service's ASGI app (the FastAPI app behind its admission bound); its lifespan
    starts and stops the version follower, the scoring task and the ``served_log``'s
    writer, and keeps the stop within the grace of ``clock`` (``serving_export.shutdown``).
    ``replica`` names this service in the registry's notes (default: the host name)."""
    from contextlib import asynccontextmanager

    token = cfg.bearer_token()
    state = ServingState()
    metrics = ServingMetrics()
    replica = replica or socket.gethostname()
    follower = VersionFollower(registry, store, state, metrics, cfg, replica, served_log)
    metrics.registry.register(_OnlineCollector(follower))
    metrics.registry.register(_GateCollector(state))
    if served_log is not None:
        metrics.registry.register(_LogCollector(served_log))

    def age() -> float:
        current = state.current
        return time.time() - window_end(current.manifest) if current else float("nan")

    metrics.version_age.set_function(age)

    def scoring_error(e: Exception) -> BaseException:
        if isinstance(e, redis.RedisError):  # the Redis sparse store is away: retry elsewhere
            return RequestRejected(503, "sparse_store_unavailable", str(e))
        return e

    def parse(body: bytes, schema: SchemaConfig) -> tuple[list, list]:
        return parse_request(body, schema, cfg.max_events, served_log is not None)

    def scored(predictor: Predictor, rows: list, ids: list, scores: Any) -> None:
        assert served_log is not None
        served_log.offer(
            served_records(
                predictor.schema,
                rows,
                ids,
                predictor.version,
                predictor.tasks,
                scores.tolist(),
                now_ms(),
            )
        )

    # Redis lookups wait on the network: scored off the loop, which keeps answering probes
    offload = cfg.sparse_store == "redis"
    batcher = ScoreBatcher(
        parse, cfg.max_in_flight, scoring_error, offload, scored if served_log else None
    )

    clock = clock or StopClock(cfg.shutdown_grace_seconds)
    shutting_down = RequestRejected(
        503, "shutting_down", "this replica is stopping: retry on another one"
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        follower.start()
        if served_log is not None:
            served_log.start()
        scoring = asyncio.create_task(batcher.run(), name="scoring")
        watching = asyncio.create_task(clock.watch(batcher, shutting_down), name="stop")
        yield
        for task in (watching, scoring):
            task.cancel()
        follower.stop(timeout_s=min(1.0, clock.left()))
        logged = ""
        if served_log is not None:
            served_log.stop(timeout_s=max(clock.left(), 0.5))
            counts = served_log.counts()
            logged = f"; served log: {counts.logged} logged, {counts.unlogged} could not be"
        log.info(
            "stopped %.1f s after the signal: %d requests refused as it stopped%s",
            *(clock.elapsed(), clock.refused, logged),
        )

    def refused() -> None:
        metrics.overloaded.inc()
        metrics.requests.labels("predict", "503").inc()

    app = FastAPI(title="streamrec predictor", lifespan=lifespan)

    @app.exception_handler(Unauthorized)
    async def unauthorized(_: Request, e: Unauthorized) -> Response:
        metrics.requests.labels(e.endpoint, "401").inc()
        return e.response

    @app.post("/predict", dependencies=[Depends(token_guard(token, "predict"))])
    async def predict(request: Request) -> Response:
        with metrics.in_flight.track_inprogress():
            return await _predict(request)

    async def _predict(request: Request) -> Response:
        started = time.perf_counter()
        try:
            body = await _read_body(request, cfg.max_body_bytes)
            # read once: this request's version, whatever swaps
            predictor = state.answering(cfg.canary_share, cfg.holdout_share)
            if predictor is None:
                raise RequestRejected(503, "not_ready", "no model version is loaded yet")
            # parsed and scored with the requests waiting beside it
            ids, scores = await batcher.score(predictor, body)
        except RequestRejected as e:
            metrics.requests.labels("predict", str(e.response.status_code)).inc()
            return e.response
        except Exception:
            log.exception("scoring a /predict request failed")
            metrics.requests.labels("predict", "500").inc()
            return _error(500, "internal_error", "scoring failed; the service's log has why")
        metrics.events.inc(len(ids))
        metrics.requests.labels("predict", "200").inc()
        metrics.latency.observe(time.perf_counter() - started)
        answer: dict[str, Any] = {"version": predictor.version, "p_click": scores[0]}
        answer["event_ids"] = ids
        if len(predictor.tasks) > 1:  # each task's probabilities by its label's name
            answer["p"] = dict(zip(predictor.tasks, scores, strict=True))
        return JSONResponse(answer)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        current = state.current
        if current is None:
            return _error(503, "not_ready", "no model version is loaded yet")
        return JSONResponse({"status": "ready", "version": current.version})

    @app.get("/version", dependencies=[Depends(token_guard(token, "version"))])
    def version() -> Response:
        current = state.current
        if current is None:
            return _error(503, "not_ready", "no model version is loaded yet")
        m = current.manifest
        return JSONResponse(
            {
                "version": current.version,
                "host": socket.gethostname(),
                "replica": replica,
                "model": m.model,
                "network": m.network,
                "runtime": current.runtime,
                "sparse": m.sparse.model_dump(),
                "freshness": {**m.freshness.model_dump(), "served_at": state.served_at},
                "loaded_at": state.swaps[-1][2],
                "age_seconds": age(),
                "swaps": list(state.swaps),
            }
        )

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # outermost, so that a refusal skips the whole FastAPI stack
    return AdmissionLimit(app, cfg.max_in_flight, cfg.retry_after_seconds, refused)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrec serve",
        description="Serve the registry's model over HTTP, following deliveries and rollbacks.",
    )
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML (real Redis)")
    parser.add_argument("--host", help="listen address (default: serving.host)")
    parser.add_argument("--port", type=int, help="listen port (default: serving.port)")
    parser.add_argument(
        "--sparse-store", choices=["inprocess", "redis"], help="default: serving.sparse_store"
    )
    parser.add_argument(
        "--runtime", choices=["paddle", "onnx"], help="dense program runner (serving.runtime)"
    )
    args = parser.parse_args(argv)
    return run_command(lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from serving_export.delivery import registry_for, sparse_store_for

    cfg = load_config(args.config)
    if cfg.redis.url == EMBEDDED:
        raise ConfigError(
            f"{args.config}: redis.url is 'embedded': give the Redis the pipeline delivers to"
        )
    overrides = {"sparse_store": args.sparse_store, "runtime": args.runtime, "host": args.host}
    given = {k: v for k, v in overrides.items() if v is not None}
    cfg = derived(cfg, f"{args.config} with the command's options", serving=given)
    try:  # refused credentials stop the service now, not on every poll
        require_credentials(cfg.redis)
    except ServiceError as e:  # a Redis not up yet: the version follower keeps trying
        log.warning("%s; serving starts and retries", e)
    host = cfg.serving.host
    port = cfg.serving.port if args.port is None else args.port
    replica = f"{socket.gethostname()}:{port}"
    served_log = None
    if (topic := cfg.serving.log_topic) is not None:
        if cfg.kafka.bootstrap_servers == EMBEDDED:
            raise ConfigError(
                f"{args.config}: serving.log_topic needs a Kafka: set kafka.bootstrap_servers"
            )
        served_log = ServedLog.to_kafka(cfg.kafka, topic, cfg.serving.log_buffer_events)
    clock = StopClock(cfg.serving.shutdown_grace_seconds, watchdog=True)
    app = create_app(
        cfg.serving, registry_for(cfg), sparse_store_for(cfg), replica, served_log, clock
    )
    log.info(
        "streamrec serve on %s:%d: model %s, %s sparse store",
        host,
        port,
        cfg.model.model,
        cfg.serving.sparse_store,
    )
    # no proxy-header rewriting: nothing here reads the client's address
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=cfg.serving.shutdown_grace_seconds,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    clock.stopping = lambda: server.should_exit
    server.run()  # a signal's stop ends in KeyboardInterrupt: exit 130 (streamrec.entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
