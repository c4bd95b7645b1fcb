"""The chaos soak: the pipeline as a user runs it, on real services, while a driver kills
its parts at random; then what must hold after it.

    .venv/bin/python tests/soak/chaos.py [--passes 30] [--seed 1] [--keep DIR]

runs the long soak on demand; ``tests/soak/test_chaos.py`` runs a short one in CI.

The stack: the embedded broker; a redis-server with an append-only file (fsync always),
restarted with its data, its default user off and one ACL user whose password every
service and Airflow task reads from the environment; and the streamrec services through
their CLIs (``build-passes``, ``cluster``, ``serve``) with Airflow's api-server, scheduler
and dag-processor running dags/streamrec_pass.py. The cluster follows the passes
(``cluster.follow_passes``: it trains, judges and delivers each one as it completes) and
the DAG watches each. A replay producer sends ``passes`` one-minute windows of the
synthetic stream, one every ``pace_s`` seconds (event times from the last hour, so the
scheduler's catch-up runs them as they complete), and a client sends ``/predict`` all
along.

Each time one more pass is finished (served, or rejected by the gate) the driver injects
the next fault, in a random order that goes through every kind before repeating: SIGKILL
of the pass builder, a worker, a server, the scheduler (its process group, as systemd
stops a unit), ``streamrec cluster`` itself (its node agent and pass follower) while a
pass is in flight, the serving service or Redis, or a pause (SIGSTOP) of the broker. The
driver restarts what it killed 2 s later, as a service manager would (the cluster restarts
its own processes, Airflow retries its tasks), and restarts any service that exits by
itself (reported: ``Restart=always``). A fault is recovered when the first pass whose
training started after it is finished (the builder and the broker: when the next pass is
complete; the service: when ``/readyz`` answers; the scheduler: when a DAG run succeeds).

At the end (``SoakReport.problems``): every produced impression is in exactly one trained
pass, by event id, and every pass trained and evaluated its manifest's rows; every pass was
trained by one command, in window order; every answered request named a delivered version
that verifies; the mean progressive AUC is within 0.01 of an undisturbed cluster's on the
same passes; every window's DAG run watched it to success; and no file the run wrote
(logs, Airflow's task logs and database, configs, checkpoints, artifacts) holds the Redis
password.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import redis

from devservices.kafka_broker import start_kafka
from ops.airflow_local import LocalAirflow
from ops.status import pass_finished
from serving_export.artifact import verify_artifact, version_dir
from serving_export.delivery import registry_for
from streaming.producer import (
    ensure_event_topics,
    make_producer,
    messages_for,
    send_messages,
    synthetic_passes,
)
from streamrec.config import (
    PathConfig,
    PipelineConfig,
    ScheduleConfig,
    derived,
    dump_config,
    load_config,
    with_services,
)
from streamrec.contracts.pass_status import read_statuses
from streamrec.logs import setup_logging
from streamrec.passes import PassClock, complete_passes, pass_dir, read_manifest
from streamrec.ports import free_port
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys
from trainers.checkpoints import list_checkpoints
from trainers.control_plane import ClusterClient
from trainers.hosts.topology import ROLE_ENV
from trainers.launcher import LocalCluster

log = logging.getLogger("soak")
REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("streamrec"))
FAULTS = ["builder", "worker", "server", "scheduler", "cluster", "serving", "redis", "broker"]
RESTART_AFTER_S = 2.0
BROKER_PAUSE_S = 10.0
AUC_TOLERANCE = 0.01
REDIS_USER, REDIS_PASSWORD_ENV = "soak", "SOAK_REDIS_PASSWORD"


@dataclass
class Fault:
    kind: str
    at: float  # epoch seconds, when injected
    detail: str = ""
    recovered_at: float | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at


@dataclass
class SoakReport:
    passes: list[str]
    faults: list[Fault]
    requests: dict[str, int]
    auc: float
    undisturbed_auc: float
    exits: list[str]
    problems: list[str] = field(default_factory=list)

    def table(self, started: float) -> str:
        lines = [f"{'fault':<10} {'at s':>7} {'recovered after s':>18}  detail"]
        for f in self.faults:
            rec = f"{f.recovery_s:18.1f}" if f.recovery_s is not None else f"{'NOT RECOVERED':>18}"
            lines.append(f"{f.kind:<10} {f.at - started:7.1f} {rec}  {f.detail}")
        lines.append(
            f"{len(self.passes)} passes; requests {self.requests}; mean progressive AUC"
            f" {self.auc:.4f}, undisturbed {self.undisturbed_auc:.4f}"
        )
        lines.append(f"services that exited by themselves: {self.exits or 'none'}")
        return "\n".join(lines)


class PersistentRedis:
    """redis-server on a fixed port with an append-only file synced on every write, so a
    SIGKILLed server restarts with everything it acknowledged; only ``REDIS_USER`` with
    ``password`` may use it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.password = secrets.token_urlsafe(16)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        command = [shutil.which("redis-server") or "redis-server", "--port", str(self.port)]
        command += ["--bind", "127.0.0.1", "--dir", str(self.dir), "--save", ""]
        command += ["--appendonly", "yes", "--appendfsync", "always"]
        # nobody logs in as default, but it keeps its permissions: Redis 7.0 replays MULTI/EXEC
        # from the append-only file as that user, and without them dropped every transaction
        # on restart (redis/redis#14541; this soak found it as passes with no train command)
        command += ["--user", "default", "off", "~*", "&*", "+@all"]
        command += ["--user", REDIS_USER, "on", f">{self.password}", "~*", "&*", "+@all"]
        with open(self.dir / "redis.log", "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _until(self.pings, 30, "redis-server to answer")

    def pings(self) -> bool:
        client = redis.Redis.from_url(
            self.url, username=REDIS_USER, password=self.password, socket_timeout=1
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def _until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class Service:
    """A streamrec CLI service, restartable."""

    def __init__(self, name: str, logs: Path, *args: str) -> None:
        self.name, self.log, self.args = name, logs / f"{name}.log", args
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [CLI, *self.args], stdout=out, stderr=subprocess.STDOUT, cwd=REPO
            )

    def kill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait()
        return pid

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; SIGKILL 90 s later (well past the
        cluster's ``stop_grace_seconds``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _error_of(body: bytes) -> str:
    """The ``error`` of a JSON error reply; the body's start when it is not one."""
    try:
        return str(json.loads(body).get("error"))
    except (ValueError, AttributeError):
        return body[:40].decode(errors="replace")


class RequestClient:
    """``POST /predict`` every 0.2 s; tallies the answers by version and the failures."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.versions: dict[str, int] = {}
        self.outcomes: dict[str, int] = {}
        self._stop = threading.Event()
        self._body = json.dumps({"events": [{"event_id": "soak", "sparse": {}, "dense": {}}]})

    def run(self) -> None:
        while not self._stop.wait(0.2):
            request = urllib.request.Request(
                f"{self.url}/predict", data=self._body.encode(), method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as reply:
                    version = json.loads(reply.read())["version"]
                self.versions[version] = self.versions.get(version, 0) + 1
                outcome = "answered"
            except urllib.error.HTTPError as e:
                outcome = f"http {e.code} {_error_of(e.read())}"
            except (ValueError, KeyError) as e:
                outcome = f"bad reply ({type(e).__name__})"
            except OSError as e:
                timed_out = isinstance(getattr(e, "reason", e), TimeoutError)
                outcome = "timeout" if timed_out else "no connection"  # the service was down
            except http.client.IncompleteRead:  # the service was killed while it answered
                outcome = "no connection"
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self._stop.set()


def soak_config(broker: str, redis_url: str, root: Path, first: datetime) -> PipelineConfig:
    """Labels in the impressions, 1-minute passes with 5 s lateness, the cluster following
    them, Airflow scheduling from ``first`` with short retries, Redis as ``REDIS_USER``."""
    cfg = with_services(load_config(REPO / "configs" / "pipeline.yaml"), broker, redis_url)

    return derived(
        cfg,
        "the soak's config",
        name="soak",
        redis={"username": REDIS_USER, "password_env": REDIS_PASSWORD_ENV},
        join={"mode": "label_in_impression"},
        passes={"pass_seconds": 60, "allowed_lateness_seconds": 5},
        cluster={"follow_passes": True},
        paths=PathConfig.under(root),
        schedule=ScheduleConfig(
            start=first,
            poke_seconds=2,
            retry_delay_seconds=5,
            max_retry_delay_seconds=30,
            task_retries=20,
        ),
    )


class Soak:
    """The stack, the producer, the request client and the fault driver."""

    def __init__(self, root: Path, passes: int, seed: int, pace_s: float) -> None:
        self.root, self.passes, self.pace_s = root, passes, pace_s
        self.rng = random.Random(seed)
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.faults: list[Fault] = []
        self.produced: set[str] = set()  # impressions of the measured windows
        self.windows: list[str] = []  # the measured windows, once produced
        self.production_done = threading.Event()
        self.exits: list[str] = []  # services that exited by themselves (and were restarted)
        self._supervising = threading.Lock()

    @contextmanager
    def running(self) -> Iterator[Soak]:
        with ExitStack() as stack:
            broker = start_kafka(self.logs)
            stack.callback(broker.stop)
            self.broker = broker.process
            self.redis = PersistentRedis(self.root / "redis")
            self.redis.start()
            stack.callback(self.redis.stop)
            os.environ[REDIS_PASSWORD_ENV] = self.redis.password  # inherited by every service
            stack.callback(os.environ.pop, REDIS_PASSWORD_ENV, None)
            first = PassClock(60).floor(datetime.now(UTC) - timedelta(minutes=self.passes + 10))
            self.cfg = soak_config(broker.address, self.redis.url, self.root, first)
            self.first = first
            config = str(dump_config(self.cfg, self.root / "pipeline.yaml"))
            self.config_path = Path(config)
            self.client = ClusterClient.from_config(self.cfg)
            self.cluster = Service("cluster", self.logs, "cluster", "--config", config)
            self.builder = Service("builder", self.logs, "build-passes", "--config", config)
            port = free_port()
            self.serving = Service(
                "serving", self.logs, "serve", "--config", config, "--port", str(port)
            )
            for service in (self.cluster, self.builder, self.serving):
                service.start()
                stack.callback(service.stop)
            _until(
                lambda: len(self.client.live_workers()) >= self.cfg.cluster.workers,
                300,
                "the cluster's workers",
            )
            self.airflow = LocalAirflow(self.root / "airflow", self.config_path)
            stack.enter_context(self.airflow)
            self.requests = RequestClient(port)
            threading.Thread(target=self.requests.run, name="requests", daemon=True).start()
            stack.callback(self.requests.stop)
            stop_supervisor = threading.Event()
            supervisor = threading.Thread(target=self._supervise, args=(stop_supervisor,))
            supervisor.start()
            stack.callback(supervisor.join)
            stack.callback(stop_supervisor.set)
            producer = threading.Thread(target=self._produce, name="replay", daemon=True)
            producer.start()
            yield self

    def _produce(self) -> None:
        """Each window's events in one go, one window every ``pace_s`` (then the tail)."""
        ensure_event_topics(self.cfg)
        producer = make_producer(self.cfg.kafka)
        first = self.first.strftime("%Y%m%d%H%M")
        try:
            for index, (pass_id, batch) in enumerate(
                synthetic_passes(self.cfg, first, self.passes)
            ):
                send_messages(producer, messages_for(self.cfg, batch))
                if index < self.passes:  # not the tail that closes the last window
                    self.produced.update(e["event_id"] for e in batch.events)
                    self.windows.append(pass_id)
                time.sleep(self.pace_s)
        finally:
            producer.close()
            self.production_done.set()

    # what the pipeline has done

    def train_results(self) -> dict[str, list[dict[str, Any]]]:
        """Every train command that trained (not an 'already done' answer), by pass."""
        r, keys = connect(self.cfg.redis), RedisKeys(self.cfg.name)
        trained: dict[str, list[dict[str, Any]]] = {}
        for key in scan_keys(r, keys.command("*")):
            command = r.hgetall(key)
            if command.get("kind") == "train" and command.get("status") == "done":
                result = json.loads(command["result"])
                if not result.get("already_done") and not result.get("already_in_model"):
                    trained.setdefault(command["pass_id"], []).append(result)
        return trained

    def complete(self) -> list[str]:
        return complete_passes(self.cfg.paths.data_root)

    def pass_states(self) -> dict[str, tuple[float | None, bool]]:
        """Each complete pass: when its training started, and whether it is finished
        (delivered, rejected by the gate, or superseded by a newer pass of its run). Empty
        while Redis is away."""
        try:
            r, keys = connect(self.cfg.redis), RedisKeys(self.cfg.name)
            serving = registry_for(self.cfg).serving_version()
            states = {}
            for status in read_statuses(r, keys, self.complete()):
                started = status.train.started_at if status.train else None
                states[status.pass_id] = (started, pass_finished(status, serving))
            return states
        except redis.RedisError:
            return {}

    def finished(self) -> int:
        return sum(done for _, done in self.pass_states().values())

    def all_finished(self) -> bool:
        states = self.pass_states()
        return self.production_done.is_set() and all(
            states.get(p, (None, False))[1] for p in self.windows
        )

    def _all_built(self) -> bool:
        return self.production_done.is_set() and set(self.windows) <= set(self.complete())

    def _finished_after(self, moment: float) -> bool:
        """A pass whose training started after ``moment`` is finished (or every pass is)."""
        states = self.pass_states().values()
        return any(s and s > moment and done for s, done in states) or self.all_finished()

    # faults

    def inject(self, kind: str) -> Fault | None:
        """Break ``kind`` at a moment where it matters (a worker, a server or the cluster's
        agent mid-pass), restart what was killed, and wait for the recovery; None when no
        such moment came."""
        victim, what = None, ""
        try:
            if kind in ("worker", "server", "cluster"):
                what = _until(self._training, 90, "a pass in training")
            if kind in ("worker", "server"):
                victim = self._cluster_member("TRAINER" if kind == "worker" else "PSERVER")
        except (TimeoutError, RuntimeError) as e:
            log.warning("no %s fault now: %s", kind, e)
            return None
        fault = Fault(kind, time.time())
        log.info("fault: %s", kind)
        with self._supervising:  # the supervisor must not restart what is down on purpose
            recovered = self._break(fault, victim, what)
        self.faults.append(fault)
        try:
            _until(recovered, 600, f"recovery from the {kind} fault")
            fault.recovered_at = time.time()
        except TimeoutError:
            log.error("no recovery from the %s fault", kind)
        return fault

    def _break(self, fault: Fault, victim: psutil.Process | None, what: str) -> Callable[[], bool]:
        """Inject ``fault`` (``victim``: the process to kill, doing ``what``); how to tell
        it is recovered."""
        kind, done = fault.kind, len(self.complete())

        def built_more() -> bool:
            return len(self.complete()) > done or self._all_built()

        if kind == "builder":
            fault.detail = f"pid {self.builder.kill()}"
            time.sleep(RESTART_AFTER_S)
            self.builder.start()
            return built_more
        if victim is not None:  # a worker or a server
            victim.kill()
            fault.detail = f"pid {victim.pid} during {what}"
        elif kind == "cluster":  # its members outlive it: the restarted agent kills them
            fault.detail = f"pid {self.cluster.kill()} (agent and follower) during {what}"
            time.sleep(RESTART_AFTER_S)
            self.cluster.start()
        elif kind == "scheduler":
            proc = self.airflow.procs["scheduler"]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            fault.detail = f"pid {proc.pid} and its task processes"
            time.sleep(RESTART_AFTER_S)
            self.airflow.start("scheduler")
            return lambda: self._run_succeeded_after(fault.at)
        elif kind == "serving":
            fault.detail = f"pid {self.serving.kill()}"
            time.sleep(RESTART_AFTER_S)
            self.serving.start()
            return self.requests.ready
        elif kind == "redis":
            self.redis.kill()
            fault.detail = "SIGKILL, restarted from its append-only file"
            time.sleep(RESTART_AFTER_S)
            self.redis.start()
        elif kind == "broker":
            os.kill(self.broker.pid, signal.SIGSTOP)
            time.sleep(BROKER_PAUSE_S)
            os.kill(self.broker.pid, signal.SIGCONT)
            fault.detail = f"SIGSTOP for {BROKER_PAUSE_S:.0f} s"
            return built_more
        return lambda: self._finished_after(fault.at)

    def _supervise(self, stop: threading.Event) -> None:
        """Restart a service that exited on its own, as systemd's ``Restart=always`` would;
        each such exit is reported."""
        while not stop.wait(1.0):
            with self._supervising:
                for service in (self.cluster, self.builder, self.serving):
                    assert service.proc is not None
                    if service.proc.poll() is not None:
                        self.exits.append(f"{service.name} exited {service.proc.returncode}")
                        log.error("%s exited by itself: restarting it", service.name)
                        service.start()
                for name, proc in list(self.airflow.procs.items()):
                    if proc.poll() is not None:
                        self.exits.append(f"airflow {name} exited {proc.returncode}")
                        log.error("airflow %s exited by itself: restarting it", name)
                        self.airflow.start(name)

    def _training(self) -> str | None:
        busy = [w for w in self.client.live_workers() if w.state != "idle"]
        return busy[0].state if busy else None

    def _cluster_member(self, role: str) -> psutil.Process:
        assert self.cluster.proc is not None
        for child in psutil.Process(self.cluster.proc.pid).children(recursive=True):
            try:
                if child.environ().get(ROLE_ENV) == role and "cluster_main" in " ".join(
                    child.cmdline()
                ):
                    return child
            except psutil.Error:
                continue
        raise RuntimeError(f"no {role} process in the cluster")

    def dag_runs(self) -> dict[str, dict[str, Any]]:
        """The DAG's runs by pass id."""
        clock = self.cfg.passes.clock
        runs = self.airflow.api("dags/streamrec_pass/dagRuns?limit=1000")["dag_runs"]
        return {clock.id_of(datetime.fromisoformat(r["data_interval_start"])): r for r in runs}

    def run_states(self, passes: list[str], timeout_s: float = 120) -> dict[str, str | None]:
        """Each pass's DAG run state, once every one has ended or ``timeout_s`` passed (a
        run watches its pass to the end, a poke every ``schedule.poke_seconds``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            runs = self.dag_runs()
            states = {p: runs.get(p, {}).get("state") for p in passes}
            if set(states.values()) <= {"success", "failed"} or time.monotonic() > deadline:
                return states
            time.sleep(1)

    def _run_succeeded_after(self, moment: float) -> bool:
        """A DAG run ended in success after ``moment`` (or every pass is finished)."""
        try:
            runs = self.dag_runs().values()
        except (OSError, ValueError, KeyError):  # the api-server busy or restarting
            return False
        return any(
            r["state"] == "success" and datetime.fromisoformat(r["end_date"]).timestamp() > moment
            for r in runs
        )

    # the run

    def drive(self, started: float, timeout_s: float) -> None:
        """Faults one after another, each once the last has recovered, in a random order
        through every kind, until every window is finished."""
        order: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.all_finished():
                return
            order = order or self.rng.sample(FAULTS, len(FAULTS))
            kind = order.pop()
            fault = self.inject(kind)
            if fault is None:  # not now (nothing training or exporting): later
                order.insert(0, kind)
                continue
            recovery = fault.recovery_s if fault.recovery_s is not None else float("nan")
            print(
                f"  {fault.at - started:7.1f}s {fault.kind:<9} recovered in"
                f" {recovery:5.1f}s ({fault.detail})",
                flush=True,
            )
            time.sleep(self.rng.uniform(0, 3))
        raise TimeoutError(f"the soak did not finish every pass within {timeout_s:.0f}s")

    def check(self) -> SoakReport:
        """What must hold after the soak."""
        problems = []
        passes = self.windows
        if len(passes) != self.passes:
            problems.append(f"{len(passes)} of {self.passes} windows were produced")
        if missing_kinds := sorted(set(FAULTS) - {f.kind for f in self.faults}):
            problems.append(f"faults never injected: {missing_kinds} (too few passes?)")
        if unrecovered := [f.kind for f in self.faults if f.recovered_at is None]:
            problems.append(f"faults not recovered: {unrecovered}")
        trained = self.train_results()
        if extra_passes := sorted(set(self.complete()) - set(passes)):
            problems.append(f"passes beyond the produced windows: {extra_passes}")
        seen: dict[str, str] = {}
        for pass_id in passes:
            directory = pass_dir(self.cfg.paths.data_root, pass_id)
            manifest = read_manifest(directory)
            for part in manifest.parts:
                for event_id in pq.read_table(directory / part.file, columns=["event_id"])[
                    "event_id"
                ].to_pylist():
                    if event_id in seen:
                        problems.append(f"{event_id} in {seen[event_id]} and {pass_id}")
                    seen[event_id] = pass_id
            results = trained.get(pass_id, [])
            if len(results) != 1:
                problems.append(f"pass {pass_id} trained by {len(results)} commands")
            for r in results:
                if r["rows"] != manifest.rows or not r["count_matches_manifest"]:
                    problems.append(f"pass {pass_id}: trained {r['rows']} of {manifest.rows} rows")
        if missing := self.produced - set(seen):
            problems.append(f"{len(missing)} produced impressions in no pass, e.g. {min(missing)}")
        if extra := set(seen) - self.produced:
            problems.append(f"{len(extra)} pass rows never produced, e.g. {min(extra)}")
        # one training save per pass, in order; the oldest go as newer bases come
        # (cluster.keep_bases). A run across UTC midnight also has the daily maintenance's
        # own save of the day's last pass, beside that pass's delta.
        saves = list_checkpoints(self.cfg.paths.checkpoint_root)
        order = [c.pass_id for c in saves if c.kind != "daily"]
        if not order or order != passes[-len(order) :]:
            problems.append(f"checkpoints not one per pass in order: {order}")
        if stray := [c.name for c in saves if c.kind == "daily" and c.pass_id not in order]:
            problems.append(f"daily saves of passes never trained: {stray}")
        history = registry_for(self.cfg).history(limit=1_000_000)
        delivered = {switch.version for switch in history}  # every pointer switch
        model_dir = Path(self.cfg.paths.model_root) / self.cfg.model.model
        for version in self.requests.versions:
            if version not in delivered:
                problems.append(f"a request was answered by {version}, never delivered")
                continue
            try:
                verify_artifact(version_dir(model_dir, version))
            except Exception as e:  # what a torn or tampered version raises
                problems.append(f"a request was answered by {version}, which fails: {e}")
        failures = {
            k: v
            for k, v in self.requests.outcomes.items()
            if k not in ("answered", "no connection", "timeout", "http 503 not_ready")
        }
        if failures:
            problems.append(f"requests failed: {failures}")
        if failed := {p: s for p, s in self.run_states(passes).items() if s != "success"}:
            problems.append(f"DAG runs not successful: {failed}")
        auc = _mean_auc(passes, {p: rs[0]["test"]["auc"] for p, rs in trained.items() if rs})
        undisturbed = _mean_auc(passes, self.undisturbed(passes))
        if not abs(auc - undisturbed) <= AUC_TOLERANCE:  # NaN (no AUC) fails too
            problems.append(f"mean progressive AUC {auc:.4f}, undisturbed {undisturbed:.4f}")
        return SoakReport(
            passes,
            self.faults,
            dict(self.requests.outcomes),
            auc,
            undisturbed,
            self.exits,
            problems,
        )

    def leaks(self) -> list[str]:
        """Files under the soak's directory holding the Redis password: run once every
        service has stopped and flushed."""
        secret = self.redis.password.encode()
        found = []
        for path in self.root.rglob("*"):
            try:
                if path.is_file() and secret in path.read_bytes():
                    found.append(str(path))
            except FileNotFoundError:  # a temporary file, renamed or removed meanwhile
                continue
        return found

    def undisturbed(self, passes: list[str]) -> dict[str, float]:
        """Each pass's progressive AUC from a fresh cluster trained on the same passes."""
        cfg = derived(
            self.cfg,
            "the undisturbed cluster's config",
            name="soak-undisturbed",
            paths={
                "checkpoint_root": self.root / "undisturbed" / "checkpoints",
                "work_root": self.root / "undisturbed" / "run",
            },
        )
        resolved = dump_config(cfg, self.root / "undisturbed" / "pipeline.yaml")
        with LocalCluster(cfg, resolved) as cluster:
            return {p: cluster.client.train(p).test.auc for p in passes}


def _mean_auc(passes: list[str], auc: dict[str, float]) -> float:
    """The mean over every pass after the first (a fresh model's first pass is chance)."""
    values = [auc[p] for p in passes[1:] if p in auc]
    return sum(values) / len(values) if values else float("nan")


def run_soak(root: Path, passes: int, seed: int, pace_s: float = 25.0) -> SoakReport:
    """The soak from start to checks; prints the fault table."""
    soak = Soak(root, passes, seed, pace_s)
    started = time.time()
    with soak.running():
        print(f"soak: {passes} passes, faults in random order (seed {seed})", flush=True)
        soak.drive(started, timeout_s=passes * 180 + 600)
        time.sleep(2)  # a last few requests on the final version
        soak.requests.stop()
        report = soak.check()
    if leaks := soak.leaks():
        report.problems.append(f"the Redis password is written in {leaks}")
    print(report.table(started), flush=True)
    for problem in report.problems:
        print(f"PROBLEM {problem}", flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pace", type=float, default=25.0, help="seconds between windows")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args()
    setup_logging()
    if args.keep:
        report = run_soak(args.keep, args.passes, args.seed, args.pace)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            report = run_soak(Path(tmp), args.passes, args.seed, args.pace)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
