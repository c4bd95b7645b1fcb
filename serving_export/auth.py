"""The serving token: with ``serving.bearer_token_env`` (or ``_file``) set, ``/predict``
and ``/version`` answer 401 unless the request carries ``Authorization: Bearer <token>``;
the probes and the metrics stay open for the orchestrator and the scraper. Read with
FastAPI's ``HTTPBearer``, so ``/openapi.json`` declares the scheme."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serving_export.predict_request import RequestRejected

# our own 401 (its body, its count in the metrics), not FastAPI's automatic 403
BEARER = HTTPBearer(auto_error=False, description="serving.bearer_token_env's token")


class Unauthorized(RequestRejected):
    """A guarded endpoint's request without the serving token (RFC 6750's 401)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(401, "unauthorized", "send Authorization: Bearer <token>")
        self.endpoint = endpoint
        self.response.headers["WWW-Authenticate"] = "Bearer"


def token_guard(
    token: str | None, endpoint: str
) -> Callable[[HTTPAuthorizationCredentials | None], Awaitable[None]]:
    """A FastAPI dependency: ``Unauthorized`` for ``endpoint`` unless the request's bearer
    credentials are ``token`` (no guard when ``token`` is None)."""

    # async: a sync dependency would cost every request a trip to the thread pool
    async def guard(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials is not None else ""
        # constant time: the comparison must not tell how much of a guess was right
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized(endpoint)

    return guard
