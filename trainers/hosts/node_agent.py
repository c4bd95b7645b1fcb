"""The node agent: ``streamrec cluster`` on one host. It runs that host's servers and workers
and restarts them together with every other host's, one generation at a time.

    streamrec cluster --config C [--node NAME]      # on every host of cluster.nodes

Each tick the agent heartbeats its node (``cluster:node:<name>``), reads the generation
(``trainers.hosts.generation``) and acts:

- members running: if the generation moved on, or one of its own members died, or another
  node's heartbeat expired or changed incarnation, it bumps the generation (naming the
  cause) and kills its members; the workers restore the newest checkpoints in the next
  generation and re-run the command in flight, whose cursor never moved.
- no members: it joins the forming generation; once every node has joined, each starts its
  members. A node that finds a generation started without it (it started late, or came
  back) bumps it, so that all start again together.
- Redis out of reach for ``cluster.node_timeout_seconds`` on a cluster of several hosts:
  the node is cut off, and it kills its own members rather than train on alone; the others
  see its heartbeat expire and wait for it in a new generation.

A config without ``cluster.nodes`` is one node on loopback, as before: ports are picked free
at each start, a Redis outage is ridden out, and SIGTERM lets idle workers leave cleanly.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from pathlib import Path

import redis

from streamrec.config import PipelineConfig
from streamrec.contracts.cluster import Generation, NodeBeat
from streamrec.errors import ServiceError
from streamrec.layout import Layout
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import ClusterClient
from trainers.hosts.generation import GenerationStore
from trainers.hosts.node_processes import NodeProcesses, kill_leftovers, stop_gracefully
from trainers.hosts.shared_storage import check_shared_storage, keep_marker
from trainers.hosts.topology import Topology, check_host_name

log = logging.getLogger(__name__)

TICK_S = 0.5
Roster = list[dict[str, str | int]]  # this node's live members: role, pid, memory


class NodeAgent:
    """One host's agent in a cluster of ``topology``'s nodes."""

    def __init__(
        self, cfg: PipelineConfig, config_path: Path, topology: Topology, node: str
    ) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path)
        self.topology = topology
        self.node = topology.node(node)
        self.name = node
        self.incarnation = uuid.uuid4().hex[:12]
        self.keys = RedisKeys(cfg.name)
        c = cfg.cluster
        self.timeout_s = c.node_timeout_seconds
        # short socket timeouts: a cut-off host must notice within its node timeout
        self._r = connect(cfg.redis, timeout_s=max(1.0, self.timeout_s / 4))
        self.store = GenerationStore(self._r, self.keys, topology.names)
        self.client = ClusterClient(
            self._r, self.keys, c.command_timeout_seconds, c.heartbeat_seconds
        )
        logs = Layout.of(cfg.paths).cluster_logs
        self.log_dir = logs if topology.single_host else logs / node
        self.processes: NodeProcesses | None = None
        self.generation = 0  # the generation this agent last ran members in
        self.state = "waiting"
        self._peers: dict[str, str] = {}  # node -> incarnation, in our running generation
        self._started_at = 0.0
        self._complete = False  # every member of this node was seen alive
        self._reported = False  # every worker of this node heartbeats
        self._last_contact = time.monotonic()

    @property
    def _pgid_file(self) -> Path:
        return self.log_dir / "fleetrun.pgid"

    def prepare(self) -> None:
        """Before the first tick: leftovers of a killed agent, the host name, shared storage."""
        try:
            pgid = int(self._pgid_file.read_text())
        except (OSError, ValueError):
            pgid = 0
        if pgid and (killed := kill_leftovers(pgid)):
            log.warning("killed %d process(es) an earlier agent of %s left", killed, self.name)
        check_host_name(self.node, self.topology)
        if not self.topology.single_host:
            check_shared_storage(self._r, self.keys, self.cfg.paths, self.name, self._marker_ttl)

    @property
    def _marker_ttl(self) -> float:
        return max(60.0, 6 * self.timeout_s)

    def run(self) -> None:
        """Tick until KeyboardInterrupt (SIGTERM or Ctrl-C), then ``shutdown``."""
        self.prepare()
        try:
            while True:
                self.step()
                time.sleep(TICK_S)
        except KeyboardInterrupt:
            self.shutdown()

    def step(self) -> None:
        """One look at the generation and the members, and what follows from it."""
        try:
            generation = self.store.read() or self.store.bump(None, "first start", self.name)
            roster = self.processes.roster() if self.processes else []
            self.store.beat(self._beat(roster), self.timeout_s)
            beats = self.store.beats()
            if not self.topology.single_host:
                keep_marker(self._r, self.keys, self._marker_ttl)
        except redis.RedisError as e:
            self._out_of_reach(e)
            return
        self._last_contact = time.monotonic()
        if self.processes is not None:
            self._watch(generation, beats, roster)
        else:
            self._join(generation, beats)

    def _out_of_reach(self, error: redis.RedisError) -> None:
        away = time.monotonic() - self._last_contact
        if self.processes is None or self.topology.single_host:
            log.warning("Redis out of reach (%s); riding it out", error)
            return
        if away > self.timeout_s:
            log.error(
                "Redis out of reach for %.0fs (%s): this node is cut off, stopping its members",
                away,
                error,
            )
            self._stop_members()
            self.state = "isolated"

    def _watch(self, generation: Generation, beats: dict[str, NodeBeat], roster: Roster) -> None:
        cause = self._trouble(generation, beats, roster)
        if cause is None:
            return
        if generation.number == self.generation:
            generation = self.store.bump(self.generation, cause, self.name)
            log.error("generation %d: %s", generation.number, cause)
        else:
            log.warning("generation %d began (%s)", generation.number, generation.cause)
        self._stop_members()

    def _trouble(
        self, generation: Generation, beats: dict[str, NodeBeat], roster: Roster
    ) -> str | None:
        """Why the members of this generation cannot go on (``roster``: this node's live
        members), or None."""
        assert self.processes is not None
        if generation.number != self.generation:
            return f"generation {generation.number} began"
        processes = self.processes
        if not processes.running:
            return f"process death on {self.name}: fleetrun exited ({processes.exit_code})"
        running_for = time.monotonic() - self._started_at
        start_timeout = self.cfg.cluster.start_timeout_seconds
        if not self._complete:
            self._complete = len(roster) == processes.expected
            if not self._complete and running_for > start_timeout:
                return f"start timed out on {self.name}: {len(roster)} of {processes.expected} up"
        elif len(roster) < processes.expected:
            lost = self._lost_roles(roster)
            return f"process death on {self.name}: {lost} gone"
        if self._complete and not self._reported and self.node.worker_ports:
            pids = {m["pid"] for m in roster}
            reported = sum(w.pid in pids for w in self.client.live_workers())
            self._reported = reported >= len(self.node.worker_ports)
            if not self._reported and running_for > start_timeout:
                return f"start timed out on {self.name}: {reported} worker(s) reported"
        for node, incarnation in self._peers.items():
            beat = beats.get(node)
            if beat is None:
                return f"node {node} lost: no heartbeat for {self.timeout_s:.0f}s"
            if beat.incarnation != incarnation:
                return f"node {node} restarted"
        return None

    def _lost_roles(self, roster: Roster) -> str:
        roles = [m["role"] for m in roster]
        servers = len(self.node.server_ports) - roles.count("PSERVER")
        workers = len(self.node.worker_ports) - roles.count("TRAINER")
        parts = [
            f"{servers} server(s)" if servers else "",
            f"{workers} worker(s)" if workers else "",
        ]
        return " and ".join(p for p in parts if p) or "a member"

    def _join(self, generation: Generation, beats: dict[str, NodeBeat]) -> None:
        if generation.state == "started":
            joined = self.store.ready(generation.number).get(self.name)
            if joined == self.incarnation and generation.number != self.generation:
                self._start_members(generation)
                return
            # it started without this node, or this node's members already left it
            cause = (
                f"node {self.name} restarted (its agent before this one was in generation "
                f"{generation.number}: a host crash or a killed agent)"
                if joined and joined != self.incarnation
                else f"node {self.name} joins"
            )
            self.store.bump(generation.number, cause, self.name)
            return
        if self.store.join(generation.number, self.name, self.incarnation):
            self.state = f"waiting for {sorted(set(self.topology.names) - set(beats))}"
            started = self.store.start_if_complete(generation.number, beats)
            if started is not None:
                self._start_members(started)

    def _start_members(self, generation: Generation) -> None:
        if self.topology.single_host:  # loopback ports are picked free at each start
            self.topology = Topology.from_config(self.cfg.cluster)
        try:  # names are resolved for each generation: a pod that came back may have moved
            topology = self.topology.resolved()
        except ServiceError as e:
            log.warning("cannot start generation %d yet: %s", generation.number, e)
            return
        self._peers = {
            n: i for n, i in self.store.ready(generation.number).items() if n != self.name
        }
        self.processes = NodeProcesses(self.config_path, topology, self.name, self.log_dir)
        self.processes.start(started_ms=generation.started_ms, generation=generation.number)
        self._pgid_file.write_text(str(self.processes.pid))
        self.generation = generation.number
        self._started_at = time.monotonic()
        self._complete = self._reported = False
        self.state = "running"
        log.info("generation %d started (%s)", generation.number, generation.cause)

    def _stop_members(self) -> None:
        if self.processes is not None:
            self.processes.kill()
            self.processes = None
        self._pgid_file.unlink(missing_ok=True)
        self.state = "waiting"

    def _beat(self, roster: Roster) -> NodeBeat:
        return NodeBeat(
            node=self.name,
            address=self.node.address,
            incarnation=self.incarnation,
            generation=self.generation,
            state=self.state,
            members=roster,
            host=socket.gethostname(),
            ts_ms=int(time.time() * 1000),
        )

    def shutdown(self) -> None:
        """Stop this node's members; the others restart without them, and wait for this
        node to come back. A single host lets idle workers leave cleanly first."""
        log.info("stopping node %s (SIGTERM or Ctrl-C)", self.name)
        self.state = "stopping"
        if self.processes is not None:
            if self.topology.single_host:
                stop_gracefully(
                    self.processes,
                    self.client,
                    self.cfg.cluster.heartbeat_seconds,
                    self.cfg.cluster.stop_grace_seconds,
                )
            self._stop_members()
        try:
            generation = self.store.read()
            if generation and generation.number == self.generation:
                self.store.bump(self.generation, f"node {self.name} stopped", self.name)
            self.store.forget(self.name)
        except redis.RedisError as e:
            log.warning("could not tell the other nodes this one stopped: %s", e)
