"""Load shedding for ``streamrec serve``: a bound on the predictions in flight.

A service that queues every request it is sent answers all of them late once clients
outnumber its capacity: latency grows without bound, throughput falls as the queue's
bookkeeping eats the CPU, and the liveness probe times out behind the queue. Past
``serving.max_in_flight`` admitted requests, a /predict request is answered at once with
503, a ``Retry-After`` header and the reason, before its body is read or parsed; a client
or balancer retries elsewhere. Everything else (probes, metrics) is never held back here.

A pure ASGI middleware, so a refusal costs one counter check and one small response: the
refusals must stay cheap, or refusing would take the CPU the admitted requests need.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from serving_export.api_models import ErrorAnswer

GUARDED_PATH = "/predict"


class AdmissionLimit:
    """Admit at most ``limit`` /predict requests at once; refuse the rest with 503.

    ``on_reject`` is called once per refusal (the service counts it in its metrics). The
    count is a plain integer: every ASGI call runs on the one event loop thread.
    """

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        retry_after_seconds: int,
        on_reject: Callable[[], None],
    ) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0
        self._on_reject = on_reject
        body = ErrorAnswer(
            error="overloaded",
            detail=f"{limit} predictions in flight (serving.max_in_flight); "
            f"retry after {retry_after_seconds} s or on another replica",
        )
        self._body = body.model_dump_json().encode()
        self._start = {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(self._body)).encode()),
                (b"retry-after", str(retry_after_seconds).encode()),
            ],
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != GUARDED_PATH:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self._on_reject()
            await send(self._start)
            await send({"type": "http.response.body", "body": self._body})
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
