"""A ``/predict`` request read and checked: its body within ``serving.max_body_bytes``, its
JSON, its events (``streaming.events.scoring_row``, the check ``/openapi.json``'s event
schema is held to); each refusal a ``RequestRejected`` carrying its ``ErrorAnswer``."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from serving_export.api_models import ErrorAnswer
from streaming.errors import MalformedEvent
from streaming.events import scoring_row
from streamrec.config import SchemaConfig


def error_response(code: int, reason: str, detail: str = "") -> Response:
    """An ``ErrorAnswer`` with HTTP status ``code``."""
    body = ErrorAnswer(error=reason, detail=detail).model_dump_json()
    return Response(body, status_code=code, media_type="application/json")


class RequestRejected(Exception):
    """A request refused with its status and reason; ``response`` is what it is answered."""

    def __init__(self, code: int, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.response = error_response(code, reason, detail)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body; RequestRejected (413) past ``limit`` bytes, declared or sent."""
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
) -> tuple[list[dict[str, Any]], list[Any]]:
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
