"""One host's share of the cluster: a fleetrun process and the servers and workers it starts.

fleetrun gets the whole cluster's endpoints and starts the members at its node's address
(``POD_IP``), with ``PADDLE_WITH_GLOO=1`` so ``fleet.util`` collectives (metrics, barriers)
work. It exits 0 even when a worker crashes and never stops a node's servers unless that
node's workers end, so health is judged here, from its children, not from its exit code.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from streamrec.errors import StreamrecError
from streamrec.waiting import poll_until
from trainers.control_plane import GENERATION_ENV, NODE_ENV, STARTED_ENV, ClusterClient
from trainers.errors import ClusterUnavailable
from trainers.hosts.topology import ROLE_ENV, Role, Topology
from trainers.worker import cluster_main

log = logging.getLogger(__name__)


def fleetrun_path() -> str:
    """The fleetrun next to this Python, or on PATH."""
    beside = Path(sys.executable).with_name("fleetrun")
    found = str(beside) if beside.exists() else shutil.which("fleetrun")
    if not found:
        raise ClusterUnavailable(
            "fleetrun not found: install paddlepaddle==2.6.2 in this environment"
        )
    return found


class NodeProcesses:
    """fleetrun for node ``node`` of ``topology``, in a process group of its own."""

    def __init__(self, config_path: Path, topology: Topology, node: str, log_dir: Path) -> None:
        self.config_path = Path(config_path).resolve()
        self.topology = topology
        self.node = topology.node(node)
        self.log_dir = Path(log_dir)
        self._proc: subprocess.Popen | None = None

    @property
    def expected(self) -> int:
        """How many members this node runs."""
        return len(self.node.server_ports) + len(self.node.worker_ports)

    def start(self, started_ms: int, generation: int = 0) -> None:
        """Launch fleetrun; its members start a few seconds later (Paddle's import)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PADDLE_WITH_GLOO": "1",
            "GLOG_minloglevel": "2",
            "FLAGS_call_stack_level": "2",
            "POD_IP": self.node.address,  # fleetrun finds its node by it, not by --host
            STARTED_ENV: str(started_ms),
            GENERATION_ENV: str(generation),
            NODE_ENV: self.node.name,
        }
        cmd = [
            fleetrun_path(),
            *self.topology.fleetrun_args(),
            *("--log_dir", str(self.log_dir)),
            cluster_main.__file__,
            *("--config", str(self.config_path)),
        ]
        log.info(
            "starting node %s: %d server(s), %d worker(s) of %s, logs in %s",
            self.node.name,
            len(self.node.server_ports),
            len(self.node.worker_ports),
            self.topology.server_endpoints + " / " + self.topology.worker_endpoints,
            self.log_dir,
        )
        with open(self.log_dir / "fleetrun.log", "ab") as out:
            # cwd: Paddle writes train_desc / http.log files into the working directory
            self._proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=self.log_dir,
            )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """fleetrun itself is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def members(self, role: Role | None = None) -> list[psutil.Process]:
        """The live server and worker processes (fleetrun's children running cluster_main);
        with ``role``, only those fleetrun started as it."""
        return [process for process, r in self._scan() if role in (None, r)]

    def roster(self) -> list[dict[str, str | int]]:
        """Each live member's role, pid and resident memory, read once (what a node
        reports)."""
        members: list[dict[str, str | int]] = []
        for process, role in self._scan():
            try:
                rss = process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            members.append({"role": role, "pid": process.pid, "rss_bytes": rss})
        return members

    def _scan(self) -> list[tuple[psutil.Process, str]]:
        if not self.running:
            return []
        assert self._proc is not None
        try:
            # fleetrun's own children only: a worker's forks carry its command line too
            # (gloo's rendezvous store for seconds at start, each pipe reader until its
            # exec), and counted as members they made a healthy cluster look broken
            children = psutil.Process(self._proc.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE and any(
                    arg.endswith("cluster_main.py") for arg in child.cmdline()
                ):
                    alive.append((child, child.environ().get(ROLE_ENV, "")))
            except psutil.NoSuchProcess:
                continue
        return alive

    def wait(self, timeout_s: float) -> None:
        """Wait for fleetrun to exit; ``subprocess.TimeoutExpired`` if it does not."""
        if self._proc is not None:
            self._proc.wait(timeout_s)

    def kill(self) -> None:
        """Kill fleetrun and every process it started."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


def kill_leftovers(pgid: int) -> int:
    """SIGKILL what is left of the process group ``pgid`` that an earlier node agent gave
    fleetrun (an agent killed before it could stop its members leaves them running); how
    many processes were killed. Only fleetrun and cluster members are touched."""
    killed = 0
    for process in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(process.pid) != pgid:
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            if "fleetrun" in cmdline or "cluster_main.py" in cmdline:
                process.kill()
                killed += 1
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            continue
    return killed


def wait_for_workers(
    processes: NodeProcesses, client: ClusterClient, workers: int, timeout_s: float
) -> None:
    """Block until ``workers`` of this node's workers send heartbeats (a killed one's linger
    a few seconds, so only this fleetrun's members count)."""

    def reported() -> bool | None:
        if not processes.running:
            raise ClusterUnavailable(
                f"fleetrun exited with {processes.exit_code} during start; "
                f"see {processes.log_dir}/workerlog.* and serverlog.*"
            )
        ours = {p.pid for p in processes.members()}
        alive = sum(w.pid in ours for w in client.live_workers())
        return True if alive >= workers else None

    if poll_until(reported, timeout_s, 0.5) is None:
        processes.kill()
        raise ClusterUnavailable(
            f"workers did not report within {timeout_s:.0f}s; see {processes.log_dir}/workerlog.*"
        )
    log.info("cluster ready: %d workers alive", workers)


def stop_gracefully(
    processes: NodeProcesses, client: ClusterClient, heartbeat_s: float, timeout_s: float
) -> None:
    """Stop within about ``timeout_s``: idle workers take a ``stop`` command and leave, and
    fleetrun exits with its servers. Busy workers, or a stop that does not finish in time,
    are killed with fleetrun's whole process group: the command in flight stays queued,
    and the next start restores the newest checkpoints and runs it."""
    if not processes.running:
        return
    busy = _busy_states(client, heartbeat_s)
    if busy:
        log.warning("workers busy (%s): killing the cluster; the next start resumes", busy)
        processes.kill()
        return
    try:
        client.stop(timeout_s=timeout_s)
        processes.wait(timeout_s)
    except (StreamrecError, subprocess.TimeoutExpired) as e:
        log.warning("cluster did not stop cleanly (%s); killing it", e)
        processes.kill()


def _busy_states(client: ClusterClient, heartbeat_s: float) -> list[str]:
    """States of the workers that are not idle; a command the client saw finish may still
    show for a moment (its result is recorded before the worker turns idle)."""

    def busy() -> list[str]:
        return [w.state for w in client.live_workers() if w.state != "idle"]

    if poll_until(lambda: [] if not busy() else None, 2 * heartbeat_s, 0.1) is not None:
        return []
    return busy()
