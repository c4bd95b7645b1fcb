"""HTTP load on `streamrec serve` from h2load (Debian's ``nghttp2-client``), with a probe.

h2load is C: one core of it sends tens of thousands of requests a second, where a Python
client saturates its own event loop first and then measures itself (a first version of
this bench in asyncio reported 100 ms probe latencies that were its own queue). It holds
a rate per connection (``--rps``: an open loop, so a slow service is not given a gentler
load) and logs every request's status and latency (``--log-file``), so latencies are
split by status. wrk and ab hold no rate; wrk2 is not packaged.

- ``closed``: N connections, each sending its next request when the last is answered.
- ``open``: ``rate`` requests a second spread over ``connections`` connections, which
  open over one period of their timers so that their requests do not come in bursts.

Meanwhile a second h2load asks ``GET /healthz`` 20 times a second on one connection, as
an orchestrator's liveness probe would.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

PROBES_PER_S = 20


def h2load() -> str:
    """The h2load binary; SystemExit with the fix when it is not installed."""
    path = shutil.which("h2load")
    if path is None:
        raise SystemExit("bench/serving.py needs h2load: apt-get install nghttp2-client")
    return path


def _run(
    url: str,
    seconds: float,
    connections: int,
    rps: float | None,
    log: Path,
    body: Path | None,
    cpus: set[int],
) -> subprocess.Popen:
    argv = [h2load(), "--h1", "-c", str(connections), "-t", "1", "-m", "1", "--log-file", str(log)]
    if rps is None:
        argv += ["-D", f"{seconds:g}"]
    else:
        # h2load starts every connection at once, and each sends on its own timer: their
        # requests would arrive in bursts of `connections`. Opened a few each millisecond
        # over one period of the timer instead, they arrive spread out, as independent
        # clients' do.
        per_ms = math.ceil(connections * rps / 1000)
        argv += ["--rps", f"{rps:.3f}", "-n", str(round(connections * rps * seconds))]
        argv += ["-r", str(per_ms), "--rate-period", "1ms"]
    if body is not None:
        argv += ["-d", str(body), "-H", "content-type: application/json"]
    return subprocess.Popen(
        [*argv, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )


def _read_log(log: Path) -> np.ndarray:
    """(status, latency ms) of every answered request."""
    rows = [line.split("\t") for line in log.read_text().splitlines() if line]
    return np.array([(int(r[1]), int(r[2]) / 1000) for r in rows]).reshape(-1, 2)


def _counts(output: str) -> dict[str, int]:
    """h2load's request counts: total, started, done, succeeded, failed, errored, timeout."""
    line = next(x for x in output.splitlines() if x.startswith("requests:"))
    pairs = (part.split() for part in line.removeprefix("requests:").split(","))
    return {name: int(n) for n, name in pairs}


def _elapsed(output: str) -> float:
    """How long h2load ran: an open loop that fell behind runs past its planned time."""
    line = next(x for x in output.splitlines() if x.startswith("finished in "))
    value = line.removeprefix("finished in ").split(",")[0]
    return float(value.removesuffix("ms")) / 1000 if value.endswith("ms") else float(value[:-1])


def _pct(ms: np.ndarray) -> dict[str, float]:
    if len(ms) == 0:
        return {}
    return {q: float(np.percentile(ms, float(q[1:]))) for q in ("p50", "p90", "p99", "p100")}


def load(
    port: int,
    body: Path,
    seconds: float,
    connections: int,
    rate: float | None,
    cpus: set[int],
) -> dict[str, Any]:
    """One run: ``rate`` requests/s over ``connections`` (None: a closed loop), with the
    probe; counts and latency percentiles by status, and the probe's."""
    with tempfile.TemporaryDirectory(prefix="h2load-") as tmp:
        logs = Path(tmp) / "requests.tsv", Path(tmp) / "probes.tsv"
        rps = None if rate is None else rate / connections
        url = f"http://127.0.0.1:{port}/predict"
        main = _run(url, seconds, connections, rps, logs[0], body, cpus)
        probe_url = f"http://127.0.0.1:{port}/healthz"
        probe = _run(probe_url, seconds, 1, PROBES_PER_S, logs[1], None, cpus)
        outputs = [p.communicate(timeout=seconds + 120)[0] for p in (main, probe)]
        if main.returncode or probe.returncode:
            raise RuntimeError(f"h2load failed: {outputs[main.returncode == 0]}")
        requests, probes = _read_log(logs[0]), _read_log(logs[1])
    status, latency = requests[:, 0].astype(int), requests[:, 1]
    codes = {int(c): int((status == c).sum()) for c in np.unique(status)}
    elapsed = _elapsed(outputs[0])
    return {
        "planned_seconds": seconds,
        "seconds": elapsed,
        "offered_per_s": rate,
        "statuses": codes,
        "ok_per_s": codes.get(200, 0) / elapsed,
        "answered_per_s": len(status) / elapsed,
        "latency_ms": {c: _pct(latency[status == c]) for c in codes},
        "client_errors": sum(_counts(outputs[0])[k] for k in ("errored", "timeout")),
        "probe_ms": _pct(probes[:, 1][probes[:, 0] == 200]),
        "probes": len(probes),
        "probe_failures": int((probes[:, 0] != 200).sum())
        + sum(_counts(outputs[1])[k] for k in ("errored", "timeout")),
    }
