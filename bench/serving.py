"""Serving: latency over HTTP with each sparse store, throughput, and delivery of a delta
against a full version of the same model with over a million keys in its table.

1. A real cluster trains three synthetic passes: a big one with heavy-tailed ids (the
   table grows past ``--min-keys``), then two small ones. The third pass's model is
   delivered twice: as a delta on the second's version, and as a full version (packaged
   into an empty model root and a fresh Redis key space). Delivery = packaging the artifact
   from the checkpoint saves + writing its embeddings to Redis; the in-process store's
   rebuild (what a running service does before its swap) is timed beside it.
2. `streamrec serve` runs the delta version, once per sparse store. One client on a
   keep-alive connection sends ``--requests`` requests of 1 event and a tenth as many of 256
   (events of the third pass, so lookups hit); then ``--clients`` clients send batch-1
   requests for ``--seconds``. Then once more in-process with the ONNX runtime. The
   baseline is the same Predictor called in-process (no HTTP, no JSON): the ratio says
   what the service adds. Then in-process again with ``serving.log_topic`` on (every
   answered event logged to Kafka), then the two in-process runs once more: the mean
   batch-1 p99 of the two runs with the log over that of the two without is what logging
   costs a request (one run's p99 moves by a quarter between runs on this machine), and
   the runs' logged and unlogged counts say whether it kept up (a ratio bought by dropping
   records would not be one). In these runs the broker's threads are pinned to the last
   core: a deployment runs Kafka on hosts of its own, and on two shared cores its JVM's
   bursts (its idle work too) landed on the service's tail (docs/decisions/). One more pair,
   the broker on every core, is printed beside them.
3. Overload (``measure_overload``), twice: with the config's ``serving.max_in_flight`` and
   with no bound (the baseline). The service gets its own cores and bench/loadgen.py the
   last one, so the load's CPU does not come out of the service's. Capacity is the best
   closed-loop goodput of 4, 64 and as many clients as the bound admits; then an open loop
   at 4x that capacity on up to 1,000 connections, with a /healthz probe every 50 ms;
   then 4 clients again.

    .venv/bin/python bench/serving.py [--big-rows 900000] [--small-rows 20000]

Ends with ``RESULT p99_ms_batch1``, ``RESULT p99_ms_batch1_redis``,
``RESULT delta_over_full``, ``RESULT overload_goodput_ratio`` (answered 200 per second
under the overload, over the capacity), ``RESULT overload_p99_ms_admitted``,
``RESULT overload_healthz_p99_ms`` and ``RESULT log_overhead_p99_ratio``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import loadgen
import numpy as np
import psutil
import pyarrow.parquet as pq
from machine import hardware_line
from pipeline import STREAMREC, bench_config, build, delivering_every_pass

from devservices.local_services import local_services
from ops import pass_sequence
from serving_export import delivery
from serving_export.predictor import Predictor
from serving_export.sparse_store import InProcessStore
from streamrec.config import PipelineConfig, derived, dump_config, load_config
from streamrec.passes import pass_dir, read_manifest
from streamrec.ports import free_port
from trainers.launcher import LocalCluster

BIG_FIRST, SMALL_FIRST = "202601010000", "202601010010"
LOADS = (1.5, 2, 4)  # the overload phase's open-loop loads, as multiples of the capacity


def _timed(step) -> tuple[Any, float]:
    started = time.perf_counter()
    value = step()
    return value, time.perf_counter() - started


def _deliver_timed(cfg: PipelineConfig, raw: str, decision) -> dict[str, float]:
    manifest, package_s = _timed(lambda: delivery.publish(cfg, raw, decision))
    result, deliver_s = _timed(lambda: delivery.deliver(cfg, manifest.version))
    model_dir = Path(cfg.paths.model_root) / cfg.model.model
    _, rebuild_s = _timed(lambda: InProcessStore(model_dir).embeddings_for(manifest.version))
    return {
        "kind": manifest.sparse.kind,
        "keys": manifest.sparse.keys,
        "table_keys": manifest.sparse.table_keys,
        "package_s": package_s,
        "redis_s": result.redis.seconds if result.redis else 0.0,
        "deliver_s": deliver_s,
        "total_s": package_s + deliver_s,
        "inprocess_from_scratch_s": rebuild_s,
    }


def _inprocess_swap_s(cfg: PipelineConfig, parent: str, version: str) -> float:
    """What a running in-process service spends on a new version: apply it to the parent."""
    store = InProcessStore(Path(cfg.paths.model_root) / cfg.model.model)
    store.embeddings_for(parent)
    return _timed(lambda: store.embeddings_for(version))[1]


def train_and_deliver(root: Path, services, big_rows: int, small_rows: int) -> dict[str, Any]:
    heavy = {"cardinality": {"user_id": 50_000_000, "item_id": 50_000_000}, "zipf_a": 1.05}
    cfg = bench_config(services, root, "serving", small_rows, **heavy)
    cfg = delivering_every_pass(cfg, base_every_passes=100)
    big = derived(cfg, "the big pass's config", synthetic={"events_per_pass": big_rows})
    print(f"building passes: 1 x {big_rows} rows, 2 x {small_rows} rows", flush=True)
    (first,) = build(big, 1, BIG_FIRST)
    second, third = build(cfg, 2, SMALL_FIRST)
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, config) as cluster:
        c = cluster.client
        for pass_id in (first, second):
            print(f"training {pass_id}", flush=True)
            trained = c.train(pass_id)
        decision = delivery.evaluate(cfg, trained)
        delivery.deliver(cfg, pass_sequence.export_and_publish(cfg, c, second, decision))
        trained = c.train(third)
        raw = c.export(third).raw_export  # packaged twice below, each timed
    decision = delivery.evaluate(cfg, trained)
    print("delivering the third pass as a delta, then as a full version", flush=True)
    delta = _deliver_timed(cfg, raw, decision)
    delta["inprocess_swap_s"] = _inprocess_swap_s(cfg, second, third)
    full_cfg = derived(
        cfg,
        "the full version's config",
        name="serving-full",
        paths={"model_root": root / "full-models"},
    )
    full = _deliver_timed(full_cfg, raw, decision)
    return {"cfg": cfg, "config": config, "version": third, "delta": delta, "full": full}


def _events(cfg: PipelineConfig, pass_id: str) -> list[dict[str, Any]]:
    directory = pass_dir(cfg.paths.data_root, pass_id)
    schema = cfg.feature_schema
    table = pq.read_table(directory / read_manifest(directory).parts[0].file).to_pylist()
    return [
        {
            "sparse": {s.name: row[s.name] for s in schema.sparse},
            "dense": {d.name: row[d.name] for d in schema.dense},
        }
        for row in table
    ]


class Client:
    """One keep-alive HTTP connection."""

    def __init__(self, port: int) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def predict(self, body: bytes) -> float:
        started = time.perf_counter()
        self._conn.request("POST", "/predict", body, {"content-type": "application/json"})
        response = self._conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"/predict answered {response.status}")
        return time.perf_counter() - started


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


# serving.shutdown_grace_seconds (10 by default) and the watchdog's 5 s, with room to spare
STOP_TIMEOUT_S = 30.0
# every service's stop: (which, seconds from SIGTERM to its exit, exit code or None: killed)
STOPS: list[tuple[str, float, int | None]] = []


class Served:
    """`streamrec serve` as a process on a free port, ready with a version."""

    def __init__(
        self, config: Path, store: str, runtime: str, log: Path, cpus: set[int] | None = None
    ) -> None:
        self.port = free_port()
        self.name = f"{store}/{runtime} on {log.name}"
        self._log = open(log, "w")  # noqa: SIM115  closed in stop()
        argv = [STREAMREC, "serve", "--config", str(config), "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*argv, "--sparse-store", store, "--runtime", runtime],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                if json.loads(self.get("/readyz") or b"{}").get("version"):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"streamrec serve ({store}) did not get ready: see {log}")
            time.sleep(0.2)

    def get(self, path: str) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            return conn.getresponse().read()
        finally:
            conn.close()

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; a service still running after
        ``STOP_TIMEOUT_S`` is killed and counted (``STOPS``), not left to crash the run."""
        signalled = time.monotonic()
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
            STOPS.append((self.name, time.monotonic() - signalled, code))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            STOPS.append((self.name, time.monotonic() - signalled, None))
            print(
                f"streamrec serve ({self.name}) did not stop within {STOP_TIMEOUT_S:g} s of "
                f"SIGTERM: killed (its log: {self._log.name})",
                file=sys.stderr,
            )
        finally:
            self._log.close()


def measure_service(
    config: Path,
    store: str,
    runtime: str,
    version: str,
    events: list[dict],
    requests: int,
    clients: int,
    seconds: float,
    work: Path,
) -> dict[str, Any]:
    service = Served(config, store, runtime, work / f"serve-{store}-{runtime}.log")
    port = service.port
    try:
        served = json.loads(service.get("/readyz"))["version"]
        if served != version:
            raise RuntimeError(f"streamrec serve ({store}) serves {served}, not {version}")
        one = [json.dumps({"events": [e]}).encode() for e in events[:requests]]
        many = [
            json.dumps({"events": events[i : i + 256]}).encode()
            for i in range(0, len(events) - 255, 256)
        ]
        client = Client(port)
        for body in one[:100]:  # warm-up
            client.predict(body)
        _log_flowing(service)
        batch1 = [client.predict(body) for body in one]
        batch256 = [client.predict(many[i % len(many)]) for i in range(max(1, requests // 10))]
        done = threading.Event()
        counts = [0] * clients

        def hammer(i: int) -> None:
            c = Client(port)
            while not done.is_set():
                c.predict(one[(counts[i] * 7 + i) % len(one)])
                counts[i] += 1

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        done.set()
        for t in threads:
            t.join()
        rss = psutil.Process(service.proc.pid).memory_info().rss / 2**20
        return {
            "batch1": _percentiles(batch1),
            "batch256": _percentiles(batch256),
            "throughput_rps": sum(counts) / seconds,
            "rss_mib": rss,
            "log": _log_counts(service),
        }
    finally:
        service.stop()


def _log_counts(service: Served, settle_s: float = 30) -> dict[str, float]:
    """The served log's logged, unlogged and backlog counts (empty without a log), once its
    backlog has drained (at most ``settle_s``)."""
    deadline = time.monotonic() + settle_s
    while True:
        metrics = {}
        for line in service.get("/metrics").decode().splitlines():
            name, _, value = line.partition(" ")
            if name in LOG_METRICS:
                metrics[LOG_METRICS[name]] = float(value)
        if not metrics.get("backlog") or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def _log_flowing(service: Served, timeout_s: float = 60) -> None:
    """With a served log, wait until Kafka has acknowledged what the warm-up logged: the
    topic made, its leaders known and connected. A p99 that catches the log's start (the
    topic's creation on the broker, librdkafka's first metadata round trips) measures a
    once-per-process cost, not a request's."""
    deadline = time.monotonic() + timeout_s
    while (counts := _log_counts(service, settle_s=0)) and not counts.get("logged"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the served log acknowledged nothing in {timeout_s} s")
        time.sleep(0.2)


LOG_METRICS = {
    "streamrec_serving_logged_total": "logged",
    "streamrec_serving_unlogged_total": "unlogged",
    "streamrec_serving_log_backlog": "backlog",
}


def measure_overload(
    config: Path, event: dict, seconds: float, max_in_flight: int | None, work: Path
) -> dict[str, Any]:
    """Capacity (closed loop: the best goodput of 4, 64 and as many clients as the bound
    admits, at most 1,000: the more requests wait, the larger the batches scored), then
    open-loop loads of 1.5x, 2x and 4x that capacity on 1,000 connections, then 4 clients
    again (recovery); batch-1 requests (``event``) on the in-process store. With
    ``max_in_flight`` (the baseline passes a huge one: no bound) instead of the config's."""
    cfg = load_config(config)
    if max_in_flight is not None:
        cfg = derived(cfg, "the overload config", serving={"max_in_flight": max_in_flight})
    bound = cfg.serving.max_in_flight
    config = dump_config(cfg, work / f"overload-{bound}.yaml")
    body = work / "body-batch1.json"
    body.write_text(json.dumps({"events": [event]}))
    # the load generator's CPU must not come out of the service's: each gets its own cores
    cpus = sorted(os.sched_getaffinity(0))
    mine, theirs = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    log = work / f"serve-overload-{bound}.log"
    service = Served(config, "inprocess", "paddle", log, theirs)
    try:

        def run(seconds: float, clients: int, rate: float | None = None) -> dict[str, Any]:
            return loadgen.load(service.port, body, seconds, clients, rate, mine)

        run(2, 4)  # warm-up
        capacity = {c: run(seconds, c) for c in sorted({4, 64, min(bound, 1000)})}
        peak = max(r["ok_per_s"] for r in capacity.values())
        loads = {f: run(seconds, 1000, f * peak) for f in LOADS}
        recovery = run(seconds / 2, 4)
        metrics = service.get("/metrics").decode()
    finally:
        service.stop()
    overloaded = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("streamrec_serving_overloaded_total")
    )
    return {
        "bound": bound,
        "capacity": capacity,
        "peak": peak,
        "loads": loads,
        "recovery": recovery,
        "refused": sum(x["statuses"].get(503, 0) for x in [*capacity.values(), *loads.values()]),
        "overloaded_metric": overloaded,
    }


def print_overload(runs: dict[str, dict[str, Any]]) -> None:
    """The overload phase's table: each service's capacity, the loads beyond it, recovery."""
    print(
        "\noverload: batch-1 requests, in-process store; the service on its own cores, h2load "
        "(bench/loadgen.py) on another; latencies in ms"
    )
    print(
        f"{'service':<22}{'phase':<26}{'200/s':>8}{'503/s':>8}{'late s':>8}{'200 p50':>9}"
        f"{'200 p99':>9}{'503 p99':>9}{'probe p99':>10}"
    )
    nan = float("nan")
    for name, r in runs.items():
        label = f"{name} ({r['bound'] if r['bound'] < 10**6 else 'no bound'})"
        phases = [(f"{c} clients", x) for c, x in r["capacity"].items()]
        phases += [
            *((f"open loop {f}x: {f * r['peak']:.0f}/s", x) for f, x in r["loads"].items()),
            ("4 clients after", r["recovery"]),
        ]
        for phase, x in phases:
            ok, refused = x["latency_ms"].get(200, {}), x["latency_ms"].get(503, {})
            # an open loop the service could not keep up with ran past its planned time
            late = x["seconds"] - x["planned_seconds"]
            print(
                f"{label:<22}{phase:<26}{x['ok_per_s']:>8.0f}"
                f"{x['statuses'].get(503, 0) / x['seconds']:>8.0f}{late:>8.1f}"
                f"{ok.get('p50', nan):>9.2f}{ok.get('p99', nan):>9.2f}"
                f"{refused.get('p99', nan):>9.2f}{x['probe_ms'].get('p99', nan):>10.2f}"
            )
            label = ""
        worst = r["loads"][max(LOADS)]
        other = sorted(set(worst["statuses"]) - {200, 503})
        print(
            f"{'':<22}at {max(LOADS)}x: goodput {worst['ok_per_s'] / r['peak']:.3f} of the peak "
            f"{r['peak']:.0f}/s; other statuses {other}, client errors "
            f"{worst['client_errors']}, probe failures {worst['probe_failures']}; "
            f"503s seen {r['refused']}, counted by the service {r['overloaded_metric']:.0f}"
        )


def broker_threads() -> list[int]:
    """Thread ids of the Apache Kafka broker(s) this process started."""
    return [
        t.id
        for child in psutil.Process().children(recursive=True)
        if "kafka.Kafka" in " ".join(child.cmdline())
        for t in child.threads()
    ]


@contextmanager
def broker_pinned(cpus: set[int]) -> Iterator[None]:
    """The broker's threads (and those they start) on ``cpus`` for the block."""
    threads = broker_threads()
    if not threads:
        raise RuntimeError("no Apache Kafka broker among this process's children")
    every = os.sched_getaffinity(0)
    for tid in threads:
        os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid in broker_threads():
            os.sched_setaffinity(tid, every)


def library_baseline(cfg: PipelineConfig, version: str, events: list[dict], n: int) -> float:
    """p50 ms of Predictor.score on one event, in this process (no HTTP, no JSON)."""
    predictor = Predictor(Path(cfg.paths.model_root) / cfg.model.model / version)
    for e in events[:100]:
        predictor.score([e])
    times = [_timed(lambda e=e: predictor.score([e]))[1] for e in events[:n]]
    return _percentiles(times)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-rows", type=int, default=900_000, help="rows of the big pass")
    parser.add_argument("--small-rows", type=int, default=20_000, help="rows of a small pass")
    parser.add_argument("--min-keys", type=int, default=1_000_000, help="table size wanted")
    parser.add_argument("--requests", type=int, default=10_000, help="batch-1 requests timed")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=10, help="throughput run length")
    parser.add_argument(
        "--overload-seconds", type=float, default=10, help="length of each overload phase run"
    )
    args = parser.parse_args()
    print(hardware_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        root = Path(tmp)
        with local_services(root / "services") as services:
            run = train_and_deliver(root, services, args.big_rows, args.small_rows)
            delta, full = run["delta"], run["full"]
            print(f"\ntable: {full['table_keys']} keys; the third pass changed {delta['keys']}")
            if full["table_keys"] < args.min_keys:
                print(f"WARNING: table below {args.min_keys} keys: raise --big-rows")
            print(
                f"{'delivery':<10}{'keys':>10}{'package s':>11}{'redis s':>9}{'total s':>9}"
                f"{'in-process build s':>20}"
            )
            for name, d in (("delta", delta), ("full", full)):
                build_s = d.get("inprocess_swap_s", d["inprocess_from_scratch_s"])
                print(
                    f"{name:<10}{d['keys']:>10}{d['package_s']:>11.3f}{d['redis_s']:>9.3f}"
                    f"{d['total_s']:>9.3f}{build_s:>20.3f}"
                )
            cfg, version = run["cfg"], run["version"]
            events = _events(cfg, version)
            logging_on = derived(cfg, "logging what it serves", serving={"log_topic": "served"})
            logged_config = dump_config(logging_on, root / "logged.yaml")
            baseline = library_baseline(cfg, version, events, 1000)
            runs = {  # name -> (config, store, runtime)
                "inprocess/paddle": (run["config"], "inprocess", "paddle"),
                "redis/paddle": (run["config"], "redis", "paddle"),
                "inprocess/onnx": (run["config"], "inprocess", "onnx"),
                "inprocess/paddle+log": (logged_config, "inprocess", "paddle"),
                # the pair again: one run's p99 moves by a quarter between runs here
                "inprocess/paddle (2)": (run["config"], "inprocess", "paddle"),
                "inprocess/paddle+log (2)": (logged_config, "inprocess", "paddle"),
            }

            def measured(runs: dict[str, tuple[Path, str, str]]) -> dict[str, dict[str, Any]]:
                return {
                    name: measure_service(
                        config,
                        store,
                        runtime,
                        version,
                        events,
                        args.requests,
                        args.clients,
                        args.seconds,
                        root,
                    )
                    for name, (config, store, runtime) in runs.items()
                }

            with broker_pinned({max(os.sched_getaffinity(0))}):
                results = measured(runs)
            shared = measured(
                {
                    "inprocess/paddle, broker anywhere": runs["inprocess/paddle"],
                    "inprocess/paddle+log, broker anywhere": runs["inprocess/paddle+log"],
                }
            )
            overload = {
                name: measure_overload(run["config"], events[0], args.overload_seconds, bound, root)
                for name, bound in (("bounded", None), ("unbounded", 10**6))
            }
    print(f"\nPredictor.score in-process, 1 event: p50 {baseline:.3f} ms (baseline)")
    print(
        f"{'store/runtime':<38}{'b1 p50':>8}{'b1 p99':>8}{'b256 p50':>10}{'b256 p99':>10}"
        f"{'req/s x' + str(args.clients):>12}{'RSS MiB':>9}{'p50/base':>9}"
    )
    for store, r in (results | shared).items():
        print(
            f"{store:<38}{r['batch1'][0]:>8.2f}{r['batch1'][1]:>8.2f}{r['batch256'][0]:>10.2f}"
            f"{r['batch256'][1]:>10.2f}{r['throughput_rps']:>12.0f}{r['rss_mib']:>9.0f}"
            f"{r['batch1'][0] / baseline:>9.1f}"
        )
    print_overload(overload)
    ratio = delta["total_s"] / full["total_s"]
    print(f"\ndelta delivery {delta['total_s']:.3f} s vs full {full['total_s']:.3f} s")
    logs = [r["log"] for name, r in (results | shared).items() if "+log" in name]
    log = {k: sum(x.get(k, 0) for x in logs) for k in ("logged", "unlogged", "backlog")}
    print(
        f"served log: {log.get('logged', 0):.0f} events logged, {log.get('unlogged', 0):.0f} "
        f"could not be, {log.get('backlog', 0):.0f} still queued"
    )
    killed = [name for name, _, code in STOPS if code is None]
    print(
        f"stops: {len(STOPS)} services stopped by SIGTERM, slowest in "
        f"{max((t for _, t, _ in STOPS), default=0):.1f} s, exit codes "
        f"{sorted({code for _, _, code in STOPS if code is not None})}; "
        + (f"KILLED after {STOP_TIMEOUT_S:g} s: {', '.join(killed)}" if killed else "none killed")
    )
    print(f"RESULT p99_ms_batch1 {results['inprocess/paddle']['batch1'][1]:.3f}")
    print(f"RESULT p99_ms_batch1_redis {results['redis/paddle']['batch1'][1]:.3f}")
    print(f"RESULT delta_over_full {ratio:.4f}")
    bounded = overload["bounded"]
    worst = bounded["loads"][max(LOADS)]
    admitted = worst["latency_ms"].get(200, {})
    print(f"RESULT overload_goodput_ratio {worst['ok_per_s'] / bounded['peak']:.3f}")
    print(f"RESULT overload_p99_ms_admitted {admitted.get('p99', float('nan')):.2f}")
    print(f"RESULT overload_healthz_p99_ms {worst['probe_ms'].get('p99', float('nan')):.2f}")
    # each side's p99 averaged over its two runs, measured in turn (off, on, off, on)
    off, on = (
        sum(results[f"inprocess/paddle{side}{n}"]["batch1"][1] for n in ("", " (2)")) / 2
        for side in ("", "+log")
    )
    print(
        f"batch-1 p99, mean of two runs each, the broker on the last core: {off:.3f} ms without "
        f"the log, {on:.3f} with it"
    )
    alone, logged = (
        shared[f"inprocess/paddle{side}, broker anywhere"]["batch1"][1] for side in ("", "+log")
    )
    print(
        f"one pair more, the broker on every core: {alone:.3f} ms without the log, {logged:.3f} "
        f"with it (ratio {logged / alone:.3f})"
    )
    print(f"RESULT log_overhead_p99_ratio {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
