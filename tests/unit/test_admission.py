"""The /predict admission bound on its own: a fake ASGI app that waits until released."""

from __future__ import annotations

import asyncio
import contextlib
import json

from serving_export.admission import AdmissionLimit


def _scope(path: str, fail: bool) -> dict:
    return {"type": "http", "path": path, "method": "POST", "fail": fail}


def test_past_the_bound_predict_is_refused_and_the_rest_passes() -> None:
    async def run() -> tuple[list, int, int]:
        release = asyncio.Event()

        async def app(scope, receive, send) -> None:
            await release.wait()
            if scope["fail"]:
                raise RuntimeError("a failing request still gives its place back")
            await send({"type": "http.response.start", "status": 200, "headers": []})

        refusals = []
        limit = AdmissionLimit(app, 2, 7, lambda: refusals.append(1))
        sent: list[list[dict]] = []

        async def call(path: str, fail: bool = False) -> None:
            out: list[dict] = []
            sent.append(out)

            async def send(message: dict) -> None:
                out.append(message)

            with contextlib.suppress(RuntimeError):
                await limit(_scope(path, fail), None, send)

        admitted = [asyncio.create_task(call("/predict", fail=i == 1)) for i in range(2)]
        await asyncio.sleep(0)
        await call("/predict")  # a third: refused at once, without reaching the app
        probe = asyncio.create_task(call("/healthz"))  # never held back
        await asyncio.sleep(0)
        in_flight = limit.in_flight
        release.set()
        await asyncio.gather(*admitted, probe)
        await call("/predict")  # the bound was given back, even by the failed request
        return sent, in_flight, len(refusals)

    sent, in_flight, refusals = asyncio.run(run())
    assert in_flight == 2 and refusals == 1
    start, body = sent[2]
    assert start["status"] == 503
    assert dict(start["headers"])[b"retry-after"] == b"7"
    reason = json.loads(body["body"])
    assert reason["error"] == "overloaded" and "max_in_flight" in reason["detail"]
    assert sent[0][0]["status"] == 200 and sent[1] == []  # the second one failed
    assert sent[3][0]["status"] == 200 and sent[4][0]["status"] == 200
