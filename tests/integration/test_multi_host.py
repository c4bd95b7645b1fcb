"""One pipeline over several hosts, through a real network, losing one part after another.

Four hosts made from network namespaces (``hosts.Network``): ``svc`` runs the broker,
redis-server and Airflow's api-server, scheduler and dag-processor, all listening on its
bridge address; ``h1``, ``h2`` and ``h3`` run the cluster (``streamrec cluster`` on each:
a server on h1, a server and a worker on h2, a worker on h3), two pass builders in one
consumer group (h1, h2) and two ``streamrec serve`` replicas on the Redis sparse store
(h1, h3). A replay producer sends one-minute windows of the synthetic stream from the past;
the cluster follows them (the pass follower of one host leads, another's takes over when
that host is lost) and Airflow's scheduler watches each; clients ask both replicas for
predictions all along.

While the passes flow: a worker process on h3 is SIGKILLed mid-pass (process death), then
every process of h2 is (a host crash) and h2's services are started again, then h3's link
is cut for longer than the node timeout and plugged back (a partition). After it: every
produced event is in exactly one pass, every pass was trained once and in order, every
answer came from a delivered version that verifies, the progressive AUC is within 0.01 of a
one-host cluster's on the same passes, both replicas follow a rollback, ``streamrec
status`` names the nodes, the generation and the last restart, and SIGTERM to every
service of every host leaves no process behind. The time from each loss to training
again is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from hosts import Host, Network, can_make_hosts, start_services

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
    ClusterConfig,
    PathConfig,
    PipelineConfig,
    ScheduleConfig,
    derived,
    dump_config,
    load_config,
    with_services,
)
from streamrec.contracts.pass_status import PassStatus
from streamrec.passes import PassClock, complete_passes, pass_dir, read_manifest
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import ClusterClient
from trainers.launcher import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("streamrec"))
PASSES = 6  # the issue asks for at least 6; each costs a pace of the suite's time
PACE_S = 15.0  # seconds between windows
EVENTS_PER_PASS = 8000
NODE_TIMEOUT_S = 5.0
AUC_TOLERANCE = 0.01
SERVE_PORT = 8500


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    reason = can_make_hosts()
    if reason:
        pytest.skip(reason)
    with Network(["svc", "h1", "h2", "h3"]) as net:
        yield net


def _until(
    condition: Callable[[], Any],
    timeout_s: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.3)
    pytest.fail(
        f"timed out after {timeout_s:.0f}s waiting for {what}"
        + (f"\n{explain()}" if explain else "")
    )


def _config(net: Network, root: Path) -> PipelineConfig:
    svc, h1, h2, h3 = (net.hosts[n] for n in ("svc", "h1", "h2", "h3"))
    cfg = with_services(
        load_config(REPO / "configs" / "pipeline.yaml"),
        f"{svc.address}:9092",
        f"redis://{svc.address}:6379/0",
    )
    cluster = ClusterConfig(
        nodes=[
            {"name": "h1", "address": h1.address, "server_ports": [36000]},
            {"name": "h2", "address": h2.address, "server_ports": [36000], "worker_ports": [36100]},
            {"name": "h3", "address": h3.address, "worker_ports": [36100]},
        ],
        node_timeout_seconds=NODE_TIMEOUT_S,
        heartbeat_seconds=1.0,
        follow_passes=True,  # the follower of one host leads; another's when that host is lost
    )

    first = PassClock(60).floor(datetime.now(UTC) - timedelta(minutes=PASSES + 10))
    return derived(
        cfg,
        "the hosts' config",
        name="hosts",
        cluster=cluster,
        join={"mode": "label_in_impression"},
        passes={"pass_seconds": 60, "allowed_lateness_seconds": 5},
        synthetic={"events_per_pass": EVENTS_PER_PASS},
        # one filesystem for every host: the shared storage
        paths=PathConfig.under(root),
        serving={"sparse_store": "redis", "host": "0.0.0.0", "poll_seconds": 0.5},
        schedule=ScheduleConfig(
            start=first,
            poke_seconds=2,
            retry_delay_seconds=5,
            max_retry_delay_seconds=20,
            task_retries=20,
        ),
    )


@dataclass
class Service:
    """A CLI service on one host, restartable."""

    host: Host
    name: str
    argv: list[str]
    logs: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = self.host.popen(self.argv, self.logs / f"{self.name}.log")

    def terminate(self, grace_s: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class Replica:
    """Asks one ``streamrec serve`` for a prediction every 0.2 s; tallies the answers."""

    address: str
    versions: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{SERVE_PORT}"

    def run(self) -> None:
        body = json.dumps({"events": [{"event_id": "e", "sparse": {}, "dense": {}}]}).encode()
        while not self.stop.wait(0.2):
            request = urllib.request.Request(f"{self.url}/predict", data=body, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=5) as reply:
                    version = json.loads(reply.read())["version"]
                self.versions[version] = self.versions.get(version, 0) + 1
                outcome = "answered"
            except urllib.error.HTTPError as e:
                outcome = f"http {e.code} {json.loads(e.read()).get('error')}"
            except OSError:
                outcome = "unreachable"  # its host crashed, is cut off, or it starts
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def version(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/version", timeout=3) as reply:
                return json.loads(reply.read())
        except (OSError, ValueError):
            return None


class Stack:
    """The services on the hosts, the producer, the clients and what they saw."""

    def __init__(self, net: Network, root: Path) -> None:
        self.net, self.root = net, root
        self.logs = root / "logs"
        self.cfg = _config(net, root)
        self.config = dump_config(self.cfg, root / "pipeline.yaml")
        self.r = connect(self.cfg.redis)
        self.keys = RedisKeys(self.cfg.name)
        self.client = ClusterClient.from_config(self.cfg)
        self.windows: list[str] = []
        self.produced: set[str] = set()
        self.produced_all = threading.Event()
        self.training: list[tuple[float, int, str]] = []  # (when, generation, state) seen
        self.services: dict[str, Service] = {}
        self.replicas = {h: Replica(net.hosts[h].address) for h in ("h1", "h3")}
        self.stop = threading.Event()

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def start_services(self) -> None:
        start_services(self.host("svc"), self.logs)
        config = str(self.config)
        for node in ("h1", "h2", "h3"):
            self._add(node, f"cluster-{node}", ["cluster", "--config", config])
        for node in ("h1", "h2"):
            self._add(node, f"builder-{node}", ["build-passes", "--config", config])
        for node in ("h1", "h3"):
            argv = ["serve", "--config", config, "--port", str(SERVE_PORT)]
            self._add(node, f"serve-{node}", argv)

    def _add(self, host: str, name: str, argv: list[str]) -> None:
        self.services[name] = Service(self.host(host), name, [CLI, *argv], self.logs)
        self.services[name].start()

    def airflow(self) -> LocalAirflow:
        svc = self.host("svc")
        return LocalAirflow(
            self.root / "airflow",
            self.config,
            port=8080,
            log_port=8793,
            host=svc.address,
            command_prefix=svc.command([]),
        )

    def produce(self) -> None:
        """One window's events every ``PACE_S``, then the tail that closes the last one."""
        ensure_event_topics(self.cfg)
        producer = make_producer(self.cfg.kafka)
        first = self.cfg.schedule.start.strftime("%Y%m%d%H%M")
        try:
            for index, (pass_id, batch) in enumerate(synthetic_passes(self.cfg, first, PASSES)):
                send_messages(producer, messages_for(self.cfg, batch))
                if index < PASSES:
                    self.produced.update(e["event_id"] for e in batch.events)
                    self.windows.append(pass_id)
                if self.stop.wait(PACE_S):
                    return
        finally:
            producer.close()
            self.produced_all.set()

    def watch_training(self) -> None:
        """Note each moment a worker runs a pass's ``train`` command, with its generation."""
        while not self.stop.wait(0.05):
            try:
                for w in self.client.live_workers():
                    if w.state.startswith("train "):
                        self.training.append((time.time(), w.generation, w.state))
            except redis.RedisError:
                continue

    def generation(self) -> int:
        return int(self.r.hget(self.keys.cluster_generation, "gen") or 0)

    def in_training(self, pass_index: int) -> str:
        """Block until a worker runs the train command of the pass ``pass_index`` windows
        into the replay, past its scoring (so a kill now lands mid-pass)."""
        _until(lambda: len(self.windows) > pass_index, 300, f"window {pass_index}")
        pass_id = self.windows[pass_index]
        _until(
            lambda: any(s.startswith(f"train {pass_id}: ") for _, _, s in self.training[-20:]),
            300,
            f"training on {pass_id}",
        )
        return pass_id

    def back_to_training(self, since: float, generation: int) -> float:
        """Seconds from ``since`` until a worker of a later generation trained."""
        moment = _until(
            lambda: next((t for t, g, _ in self.training if t > since and g > generation), None),
            600,
            "training in a new generation",
        )
        return moment - since

    def _statuses(self) -> dict[str, PassStatus]:
        return {p: self.client.pass_status(p) for p in self.windows}

    def finished(self) -> bool:
        """Every window produced is finished (``ops.status.pass_finished``): delivered,
        rejected by the gate, or superseded by a newer pass of its run that serves."""
        if not self.produced_all.is_set():
            return False
        serving = registry_for(self.cfg).serving_version()
        statuses = self._statuses()
        return all(pass_finished(s, serving) for s in statuses.values())

    def unfinished(self, airflow: LocalAirflow) -> str:
        """What the windows not finished have, what serves, and Airflow's unfinished tasks:
        the evidence when ``finished`` never comes."""
        serving = registry_for(self.cfg).serving_version()
        lines = [f"produced all: {self.produced_all.is_set()}; serving: {serving}"]
        for pass_id, status in self._statuses().items():
            if not pass_finished(status, serving):
                fields = status.model_dump(
                    include={"gate", "delivered", "caught_up", "superseded"}, exclude_none=True
                )
                lines.append(f"  {pass_id}: trained {status.trained}; {fields}")
        try:
            runs = airflow.api("dags/streamrec_pass/dagRuns/~/taskInstances?limit=1000")
            lines += [
                f"  {t['dag_run_id']} {t['task_id']}: {t['state']} (try {t['try_number']})"
                for t in runs["task_instances"]
                if t["state"] not in ("success", "skipped")
            ]
        except (OSError, ValueError, KeyError) as e:
            lines.append(f"  Airflow's task instances unreadable: {e!r}")
        return "\n".join(lines)

    def train_results(self) -> dict[str, list[dict[str, Any]]]:
        """Every train command that trained (not an 'already done' answer), by pass."""
        trained: dict[str, list[dict[str, Any]]] = {}
        for key in scan_keys(self.r, self.keys.command("*")):
            command = self.r.hgetall(key)
            if command.get("kind") == "train" and command.get("status") == "done":
                result = json.loads(command["result"])
                if not result.get("already_done") and not result.get("already_in_model"):
                    trained.setdefault(command["pass_id"], []).append(result)
        return trained


def _until_empty(hosts: dict[str, Host], timeout_s: float = 15) -> dict[str, list[int]]:
    """The processes left on each host once none is, or ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {name: host.pids() for name, host in hosts.items()}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.3)


def _one_host_auc(cfg: PipelineConfig, root: Path, passes: list[str]) -> dict[str, float]:
    """Each pass's progressive AUC from a fresh one-host cluster on the same passes."""
    one = derived(
        cfg,
        "the one-host config",
        name="one-host",
        cluster=ClusterConfig(servers=2, workers=2),
        paths={"checkpoint_root": root / "one-host" / "ck", "work_root": root / "one-host"},
    )
    with LocalCluster(one, dump_config(one, root / "one-host" / "pipeline.yaml")) as cluster:
        return {p: cluster.client.train(p).test.auc for p in passes}


def _mean_after_first(passes: list[str], auc: dict[str, float]) -> float:
    values = [auc[p] for p in passes[1:]]
    return sum(values) / len(values)


def test_a_pipeline_over_hosts_survives_a_process_a_host_and_a_link(
    network: Network, tmp_path: Path
) -> None:
    stack = Stack(network, tmp_path)
    threads = []
    try:
        stack.start_services()
        _until(lambda: len(stack.client.live_workers()) >= 2, 300, "the cluster's workers")
        airflow = stack.airflow()
        airflow.start_all()
        for target in (
            stack.produce,
            stack.watch_training,
            *[r.run for r in stack.replicas.values()],
        ):
            threads.append(threading.Thread(target=target, daemon=True))
            threads[-1].start()

        recovery = {}
        # process death: one worker process, mid-pass
        stack.in_training(1)
        generation, since = stack.generation(), time.time()
        pid = next(w.pid for w in stack.client.live_workers() if w.node == "h3")
        os.kill(pid, signal.SIGKILL)
        recovery["process death (worker on h3)"] = stack.back_to_training(since, generation)

        # host crash: every process of h2, mid-pass; its services started again 2 s later
        stack.in_training(3)
        generation, since = stack.generation(), time.time()
        h2_crashed_ms = since * 1000
        stack.host("h2").kill_all()
        time.sleep(2)
        for name in ("cluster-h2", "builder-h2"):
            stack.services[name].start()
        recovery["host crash (h2: server, worker, builder)"] = stack.back_to_training(
            since, generation
        )

        # partition: h3's link down for longer than the node timeout, mid-pass
        stack.in_training(5)
        generation, since = stack.generation(), time.time()
        h3_cut_ms = since * 1000
        stack.host("h3").cut()
        time.sleep(2 * NODE_TIMEOUT_S + 2)
        stack.host("h3").plug()
        recovery["partition (h3 cut for 12 s)"] = stack.back_to_training(since, generation)

        _until(
            stack.finished,
            900,
            "every window delivered or rejected",
            explain=lambda: stack.unfinished(airflow),
        )
        time.sleep(2)  # a few more answers from the final version

        # both replicas follow a rollback
        rolled = subprocess.run(
            [CLI, "rollback", "--config", str(stack.config)], capture_output=True, text=True
        )
        assert rolled.returncode == 0, (
            rolled.stderr,
            registry_for(stack.cfg).history(limit=100),
            stack.unfinished(airflow),
        )
        back_to = json.loads(rolled.stdout)["version"]
        for name, replica in stack.replicas.items():
            _until(
                lambda r=replica: (r.version() or {}).get("version") == back_to,
                30,
                f"{name} to serve {back_to}",
            )
            assert replica.version()["host"] == name

        status = subprocess.run(
            [CLI, "status", "--config", str(stack.config), "--json"],
            capture_output=True,
            text=True,
        )
        assert status.returncode == 0, status.stderr
        cluster = json.loads(status.stdout)["cluster"]
        replicas = json.loads(status.stdout)["serving"]["replicas"]
    finally:
        stack.stop.set()
        for replica in stack.replicas.values():
            replica.stop.set()
        exits = {}
        for name, service in stack.services.items():
            exits[name] = service.terminate()
        if "airflow" in locals():
            airflow.stop_all()
        left = _until_empty({n: h for n, h in network.hosts.items() if n != "svc"})

    print("\nfrom a loss to training again:")
    for cause, seconds in recovery.items():
        print(f"  {cause:<44} {seconds:6.1f} s")
    print(f"replicas' answers: { {n: r.outcomes for n, r in stack.replicas.items()} }")

    # SIGTERM to every service of every host leaves nothing behind
    assert left == {"h1": [], "h2": [], "h3": []}, left
    # clean stops: 0; the Ctrl-C convention 130 (the builder, streamrec serve); None: its
    # host's crash had already taken it
    assert all(code in (0, 130, None) for code in exits.values()), exits

    # every produced event in exactly one pass; every pass trained once, in order
    passes = stack.windows
    assert len(passes) == PASSES and set(complete_passes(stack.cfg.paths.data_root)) >= set(passes)
    seen: dict[str, str] = {}
    for pass_id in passes:
        directory = pass_dir(stack.cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            ids = pq.read_table(directory / part.file, columns=["event_id"])["event_id"]
            for event_id in ids.to_pylist():
                assert event_id not in seen, f"{event_id} in {seen[event_id]} and {pass_id}"
                seen[event_id] = pass_id
    assert set(seen) == stack.produced
    trained = stack.train_results()
    assert {p: len(trained.get(p, [])) for p in passes} == {p: 1 for p in passes}
    started = [trained[p][0]["started_at"] for p in passes]
    assert started == sorted(started)

    # the generations: one per loss, each with its cause
    history = [json.loads(h) for h in stack.r.lrange(stack.keys.cluster_history, 0, -1)]
    causes = [h["cause"] for h in history]
    assert any("process death on h3" in c for c in causes), causes
    assert any("node h3 lost" in c for c in causes), causes
    # h2's crash: the first agent to see it names what it saw: h2's own (back 2 s later),
    # or a survivor's fleetrun or worker, which die with the lost server a second after
    # the kill, before h2's heartbeat is overdue (both seen in fresh-clone runs)
    h2_crash = [h["cause"] for h in history if h2_crashed_ms <= h["started_ms"] < h3_cut_ms]
    seen_as = ("h2", "fleetrun exited", "process death")
    assert h2_crash and all(any(s in c for s in seen_as) for c in h2_crash), history
    assert set(cluster["nodes"]) == {"h1", "h2", "h3"}
    assert cluster["last_restart"] is not None
    assert {r["host"] for r in replicas} == {"h1", "h3"}

    # every answer from a delivered version that verifies, on both replicas
    delivered = {switch.version for switch in registry_for(stack.cfg).history(limit=10**6)}
    model_dir = Path(stack.cfg.paths.model_root) / stack.cfg.model.model
    for name, replica in stack.replicas.items():
        assert replica.versions, f"{name} answered nothing: {replica.outcomes}"
        failures = set(replica.outcomes) - {"answered", "unreachable", "http 503 not_ready"}
        assert not failures, (name, replica.outcomes)
        for version in replica.versions:
            assert version in delivered, f"{name} answered with {version}, never delivered"
            verify_artifact(version_dir(model_dir, version))

    # learning as a one-host cluster learns on the same passes
    auc = {p: trained[p][0]["test"]["auc"] for p in passes}
    one_host = _one_host_auc(stack.cfg, tmp_path, passes)
    print(f"mean progressive AUC: {_mean_after_first(passes, auc):.4f} over hosts, "
          f"{_mean_after_first(passes, one_host):.4f} on one host")  # fmt: skip
    assert abs(_mean_after_first(passes, auc) - _mean_after_first(passes, one_host)) <= (
        AUC_TOLERANCE
    )
