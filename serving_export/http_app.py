"""The HTTP app of ``streamrec serve`` (FastAPI on uvicorn: the ASGI stack the Python
serving ecosystem runs on, and the one Airflow already brings).

    POST /predict   PredictAnswer: each event's probabilities from one version
    GET  /healthz   HealthAnswer: the process answers
    GET  /readyz    ReadyAnswer once a verified version is loaded, 503 before (both
                    answered on the event loop at once, never behind the admission bound
                    or the predictions waiting to be scored)
    GET  /version   VersionAnswer: what serves, its freshness and swaps, this replica
    GET  /metrics   Prometheus text (``serving_metrics``)

Every answer and refusal is a model of ``api_models``, declared on its route, so
``/openapi.json`` is true; its ``/predict`` request body carries the serving version's event
schema. Past ``serving.max_in_flight`` predictions in flight, /predict answers a fast 503
"overloaded" with Retry-After (``admission``), so the latency of the admitted ones stays
bounded whatever the number of clients. The requests waiting are scored together in one
predictor call (``batcher``): one core here answered 9,700 batch-1 requests a second from
64 connections, against 2,300 when each request was scored alone. The version follower
(``follower``) swaps versions in beside the requests; the token guard is ``auth``'s.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis
from fastapi import Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving_export.admission import AdmissionLimit
from serving_export.api_models import (
    ErrorAnswer,
    HealthAnswer,
    PredictAnswer,
    PredictRequest,
    ReadyAnswer,
    Swap,
    VersionAnswer,
)
from serving_export.auth import Unauthorized, token_guard
from serving_export.batcher import ScoreBatcher
from serving_export.follower import ServingState, VersionFollower, window_end
from serving_export.predict_request import (
    RequestRejected,
    error_response,
    parse_request,
    read_body,
)
from serving_export.predictor import Predictor
from serving_export.registry import ModelRegistry
from serving_export.served_log import ServedLog, now_ms, served_records
from serving_export.serving_metrics import (
    GateCollector,
    LogCollector,
    OnlineCollector,
    ServingMetrics,
)
from serving_export.shutdown import StopClock
from serving_export.sparse_store import InProcessStore, RedisStore
from streaming.event_contract import scoring_event_schema
from streamrec.config import SchemaConfig, ServingConfig

log = logging.getLogger(__name__)

JSON = "application/json"
NOT_READY = (503, "not_ready", "no model version is loaded yet")


def _refusals(**reasons: str) -> dict[int | str, dict[str, Any]]:
    """A route's refusals for ``responses=``: status (as ``e400``) -> the reasons it has."""
    return {int(k[1:]): {"model": ErrorAnswer, "description": v} for k, v in reasons.items()}


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
    token = cfg.bearer_token()
    state = ServingState()
    metrics = ServingMetrics()
    replica = replica or socket.gethostname()
    follower = VersionFollower(registry, store, state, metrics, cfg, replica, served_log)
    metrics.registry.register(OnlineCollector(follower))
    metrics.registry.register(GateCollector(state))
    if served_log is not None:
        metrics.registry.register(LogCollector(served_log))

    def age() -> float:
        current = state.current
        return time.time() - window_end(current.manifest) if current else float("nan")

    metrics.version_age.set_function(age)

    def scoring_error(e: Exception) -> BaseException:
        if isinstance(e, redis.RedisError):  # the Redis sparse store is away: retry elsewhere
            return RequestRejected(503, "sparse_store_unavailable", str(e))
        return e

    def parse(body: bytes, schema: SchemaConfig) -> tuple[list[dict[str, Any]], list[Any]]:
        return parse_request(body, schema, cfg.max_events, served_log is not None)

    def scored(
        predictor: Predictor, rows: list[dict[str, Any]], ids: list[Any], scores: Any
    ) -> None:
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
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
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

    app = FastAPI(
        title="streamrec predictor",
        version=importlib.metadata.version("streamrec"),
        lifespan=lifespan,
    )
    app.openapi = _openapi_of_the_serving_version(app, state, cfg.max_events)  # type: ignore[method-assign]

    def guarded(endpoint: str) -> list[Any]:
        """The token's dependency for ``endpoint``; none (nor a scheme in the OpenAPI
        document) without a token."""
        return [Depends(token_guard(token, endpoint))] if token is not None else []

    unauthorized = {"e401": "unauthorized: no or a wrong bearer token"} if token else {}

    @app.exception_handler(Unauthorized)
    async def on_unauthorized(_: Request, e: Unauthorized) -> Response:
        metrics.requests.labels(e.endpoint, "401").inc()
        return e.response

    @app.post(
        "/predict",
        response_model=PredictAnswer,
        dependencies=guarded("predict"),
        responses=_refusals(
            e400="bad_json",
            **unauthorized,
            e413="body_too_large (serving.max_body_bytes) or too_many_events",
            e422="bad_request, or an event's reason (unknown_slot, wrong_type, ...)",
            e500="internal_error: the service's log has why",
            e503="not_ready, overloaded (with Retry-After), shutting_down, or "
            "sparse_store_unavailable: retry, here later or on another replica",
        ),
    )
    async def predict(request: Request) -> Response:
        """Score events with the serving version (or the canary's or holdout's share)."""
        with metrics.in_flight.track_inprogress():
            return await _predict(request)

    async def _predict(request: Request) -> Response:
        started = time.perf_counter()
        try:
            body = await read_body(request, cfg.max_body_bytes)
            # read once: this request's version, whatever swaps
            predictor = state.answering(cfg.canary_share, cfg.holdout_share)
            if predictor is None:
                raise RequestRejected(*NOT_READY)
            # parsed and scored with the requests waiting beside it
            ids, scores = await batcher.score(predictor, body)
        except RequestRejected as e:
            metrics.requests.labels("predict", str(e.response.status_code)).inc()
            return e.response
        except Exception:
            log.exception("scoring a /predict request failed")
            metrics.requests.labels("predict", "500").inc()
            return error_response(
                500, "internal_error", "scoring failed; the service's log has why"
            )
        metrics.events.inc(len(ids))
        metrics.requests.labels("predict", "200").inc()
        metrics.latency.observe(time.perf_counter() - started)
        answer = PredictAnswer(
            version=predictor.version,
            p_click=scores[0],
            event_ids=ids,
            # each task's probabilities by its label's name
            p=dict(zip(predictor.tasks, scores, strict=True)) if len(predictor.tasks) > 1 else None,
        )
        return Response(answer.model_dump_json(exclude_none=True), media_type=JSON)

    @app.get("/healthz", response_model=HealthAnswer)
    async def healthz() -> HealthAnswer:
        """The process answers."""
        return HealthAnswer(status="ok")

    @app.get("/readyz", response_model=ReadyAnswer, responses=_refusals(e503="not_ready"))
    async def readyz() -> Response | ReadyAnswer:
        """A verified version is loaded (503 before)."""
        current = state.current
        if current is None:
            return error_response(*NOT_READY)
        return ReadyAnswer(status="ready", version=current.version)

    @app.get(
        "/version",
        response_model=VersionAnswer,
        dependencies=guarded("version"),
        responses=_refusals(**unauthorized, e503="not_ready"),
    )
    def version() -> Response | VersionAnswer:
        """What this replica serves: the version, its network and runtime, its freshness."""
        current = state.current
        if current is None:
            return error_response(*NOT_READY)
        m = current.manifest
        return VersionAnswer(
            version=current.version,
            host=socket.gethostname(),
            replica=replica,
            model=m.model,
            network=m.network,
            runtime=current.runtime,
            sparse=m.sparse,
            freshness=m.freshness.model_copy(update={"served_at": state.served_at}),
            loaded_at=state.swaps[-1][2],
            age_seconds=age(),
            swaps=[Swap(version=v, before=b, after=a) for v, b, a in state.swaps],
        )

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}},
    )
    def prometheus() -> Response:
        """The service's metrics, in Prometheus's text format."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # outermost, so that a refusal skips the whole FastAPI stack
    return AdmissionLimit(app, cfg.max_in_flight, cfg.retry_after_seconds, refused)


def _openapi_of_the_serving_version(
    app: FastAPI, state: ServingState, max_events: int
) -> Callable[[], dict[str, Any]]:
    """``app``'s OpenAPI document with ``/predict``'s request body: ``PredictRequest`` whose
    events follow the serving version's feature schema (any object before one is loaded).
    Built once per version's schema; FastAPI's own document is built once."""
    built: dict[int, tuple[SchemaConfig | None, dict[str, Any]]] = {}

    def openapi() -> dict[str, Any]:
        current = state.current
        schema = current.manifest.feature_schema if current is not None else None
        cached = built.get(id(schema))
        if cached is not None and cached[0] is schema:
            return cached[1]
        spec = copy.deepcopy(FastAPI.openapi(app))
        request = PredictRequest.model_json_schema()
        events = request["properties"]["events"]
        events["maxItems"] = max_events
        if schema is not None:
            events["items"] = {
                k: v for k, v in scoring_event_schema(schema).items() if k != "$schema"
            }
        spec["paths"]["/predict"]["post"]["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": request}},
        }
        built.clear()  # the older versions' documents are not asked again
        built[id(schema)] = (schema, spec)
        return spec

    return openapi
