"""What ``streamrec serve`` is asked and answers over HTTP: one pydantic model per body, so
``/openapi.json`` says what the service does (``http_app`` declares them on its routes).

``/predict``'s body is read by hand (``predict_request``), not through ``PredictRequest``:
the service answers thousands of small requests a second per core, and the event schema
that ``/openapi.json`` gives for its events is the serving version's own
(``streaming.event_contract.scoring_event_schema``, held to the service's check by a
property test)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serving_export.manifest import Freshness, SparsePart


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PredictRequest(_Body):
    """The events to score, each ``{"event_id"?, "sparse": {...}, "dense": {...}}``."""

    model_config = ConfigDict(frozen=True, extra="allow")  # other fields are ignored

    events: list[dict[str, Any]] = Field(
        description="At most serving.max_events; the schema of one is the serving version's"
    )


class PredictAnswer(_Body):
    """Each event's probabilities, in the request's order, from one version."""

    version: str = Field(description="The version that scored every event of the request")
    p_click: list[float] = Field(description="The first task's probability of each event")
    event_ids: list[str | int | None] = Field(
        description="Each event's id as given; null when it had none (or a fresh id where "
        "the service logs what it served)"
    )
    p: dict[str, list[float]] | None = Field(
        default=None, description="With several tasks: each task's probabilities by label name"
    )


class ErrorAnswer(_Body):
    """A refused request: a reason a client can branch on, and what to change."""

    error: str = Field(
        description="unauthorized, bad_json, bad_request, too_many_events, body_too_large, "
        "an event's reason (unknown_slot, wrong_type, ...), not_ready, overloaded, "
        "shutting_down, sparse_store_unavailable or internal_error"
    )
    detail: str = Field(description="What was wrong, for a person")


class HealthAnswer(_Body):
    """The process answers."""

    status: Literal["ok"]


class ReadyAnswer(_Body):
    """A verified version is loaded."""

    status: Literal["ready"]
    version: str


class Swap(_Body):
    """One version swapped in: a request that read the serving reference between two swaps
    was scored by the version between them."""

    version: str
    before: float = Field(description="Epoch seconds just before the swap")
    after: float = Field(description="Epoch seconds just after the swap")


class VersionAnswer(_Body):
    """What this replica serves."""

    version: str
    host: str
    replica: str = Field(description="<host name>:<port>, as the registry's notes name it")
    model: str
    network: str = Field(description="The import path of the network the version trained")
    runtime: Literal["paddle", "onnx"]
    sparse: SparsePart
    freshness: Freshness = Field(description="Its pass's times, and when it was made to serve")
    loaded_at: float = Field(description="Epoch seconds of the last swap")
    age_seconds: float = Field(description="Now minus the event-time end of the version's pass")
    swaps: list[Swap] = Field(description="The last 100 swaps, oldest first")
