"""``streamrec serve`` as an operator runs it: a process on its own port, asked over HTTP."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from streamrec.entry import STOPPED
from streamrec.ports import free_port

STREAMREC = str(Path(sys.executable).parent / "streamrec")


class Service:
    """`streamrec serve` as a process, on its own port."""

    def __init__(self, config: Path, store: str, log: Path, runtime: str = "paddle") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log = open(log, "w")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(
            [
                STREAMREC,
                "serve",
                "--config",
                str(config),
                "--port",
                str(self.port),
                "--sparse-store",
                store,
                "--runtime",
                runtime,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()
            try:
                if self.client.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError(f"streamrec serve did not answer: {log.read_text()}")

    def wait_for(self, version: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.client.get("/readyz")
            if r.status_code == 200 and r.json()["version"] == version:
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.url} did not load {version}: {self.client.get('/readyz')}")

    def predict(self, events: list[dict[str, Any]]) -> tuple[str, np.ndarray]:
        r = self.client.post("/predict", json={"events": events})
        assert r.status_code == 200, r.text
        return r.json()["version"], np.array(r.json()["p_click"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:  # uvicorn shuts down gracefully, then re-raises the signal: Ctrl-C's exit code
            assert self.proc.wait(timeout=30) == STOPPED, self.log.read_text()[-3000:]
        finally:
            self.proc.kill()
            self._log.close()
            self.client.close()
