"""Requests and answers checked against the OpenAPI document a service serves: each
answer's status must be declared on its route, and its body must match that status's
schema (JSON Schema 2020-12, as OpenAPI 3.1 has it); a request body must match the
route's request schema."""

from __future__ import annotations

import json
from typing import Any

import httpx
from jsonschema import Draft202012Validator


class OpenApi:
    """The document at ``/openapi.json`` of the service ``client`` asks."""

    def __init__(self, client: httpx.Client) -> None:
        self.spec: dict[str, Any] = client.get("/openapi.json").raise_for_status().json()

    def _validator(self, schema: dict[str, Any]) -> Draft202012Validator:
        # the document's "#/components/..." references resolve against this root
        return Draft202012Validator({**schema, "components": self.spec.get("components", {})})

    def request_errors(self, path: str, body: Any) -> list[str]:
        """Why ``body`` breaks the request schema of POST ``path`` (none: it matches)."""
        content = self.spec["paths"][path]["post"]["requestBody"]["content"]
        validator = self._validator(content["application/json"]["schema"])
        return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]

    def answer_errors(
        self, method: str, path: str, status: int, media: str, body: Any
    ) -> list[str]:
        """Why an answer of ``status`` with ``body`` (decoded JSON, or text) breaks what the
        document declares for ``method`` ``path`` (none: it matches)."""
        declared = self.spec["paths"][path][method]["responses"].get(str(status))
        if declared is None:
            return [f"{method} {path} does not declare {status}"]
        content = declared.get("content", {})
        if media not in content:
            return [f"{method} {path} {status} declares {sorted(content)}, not {media}"]
        schema = content[media].get("schema")
        if schema is None:
            return []
        return [
            f"{list(e.absolute_path)}: {e.message}"
            for e in self._validator(schema).iter_errors(body)
        ]

    def check(self, response: httpx.Response) -> None:
        """Assert that ``response`` is what the document declares for its request."""
        request = response.request
        media = response.headers.get("content-type", "").split(";")[0]
        body = json.loads(response.content) if media == "application/json" else response.text
        errors = self.answer_errors(
            request.method.lower(), request.url.path, response.status_code, media, body
        )
        assert not errors, (request.method, request.url.path, response.status_code, errors)
