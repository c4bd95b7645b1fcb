"""Start the long-lived parameter-server cluster on this machine with fleetrun, and stop it.

    streamrec cluster --config configs/pipeline.yaml      # runs (and heals) until Ctrl-C

fleetrun gets explicit loopback endpoints (free ports), so a cluster never collides with
another one, and ``PADDLE_WITH_GLOO=1`` so ``fleet.util`` collectives (metrics, barriers)
work. fleetrun itself exits 0 even when a worker dies, so the launcher watches worker
heartbeats in Redis instead of trusting its exit code, and ``ensure_healthy`` restarts the
whole cluster (which restores from checkpoints) when any process is gone. On several
machines, start ``trainers/cluster_main.py`` with Paddle's PS environment variables instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import redis

from streamrec.config import PipelineConfig, dump_config, load_config
from streamrec.errors import StreamrecError
from streamrec.local_services import free_port
from streamrec.logs import setup_logging
from streamrec.redis_conn import require_credentials
from streamrec.signals import ignore_stop_signals, stop_on_sigterm
from trainers import cluster_main
from trainers.control_plane import STARTED_ENV, ClusterClient
from trainers.devices import check_device
from trainers.errors import ClusterUnavailable

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


class LocalCluster:
    """A fleetrun cluster of ``cluster.servers`` servers and ``cluster.workers`` workers."""

    def __init__(self, cfg: PipelineConfig, config_path: Path) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path).resolve()
        self.log_dir = Path(cfg.paths.work_root) / "cluster-logs"
        self.client = ClusterClient.from_config(cfg)
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Launch servers and workers and wait until every worker sends a heartbeat."""
        check_device(self.cfg.cluster.use_gpu)
        c = self.cfg.cluster
        servers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(c.servers))
        workers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(c.workers))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PADDLE_WITH_GLOO": "1",
            "GLOG_minloglevel": "2",
            "FLAGS_call_stack_level": "2",
            STARTED_ENV: str(self.client.now_ms()),
        }
        cmd = [
            fleetrun_path(),
            "--servers",
            servers,
            "--workers",
            workers,
            "--http_port",
            str(free_port()),
            "--log_dir",
            str(self.log_dir),
            cluster_main.__file__,
            "--config",
            str(self.config_path),
        ]
        log.info(
            "starting cluster: %d server(s), %d worker(s), logs in %s",
            c.servers,
            c.workers,
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
        deadline = time.monotonic() + c.start_timeout_seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ClusterUnavailable(
                    f"fleetrun exited with {self._proc.returncode} during start; "
                    f"see {self.log_dir}/workerlog.* and serverlog.*"
                )
            # heartbeats of this cluster's processes only: a killed one's linger a few seconds
            ours = {p.pid for p in self.members()}
            if sum(w["pid"] in ours for w in self.client.live_workers()) >= c.workers:
                log.info("cluster ready: %d workers alive", c.workers)
                return
            time.sleep(0.5)
        self.kill()
        raise ClusterUnavailable(
            f"workers did not report within {c.start_timeout_seconds:.0f}s; "
            f"see {self.log_dir}/workerlog.*"
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def members(self, role: str | None = None) -> list[psutil.Process]:
        """The live server and worker processes (fleetrun's children running cluster_main);
        with ``role``, only those fleetrun started as it (``PSERVER`` or ``TRAINER``)."""
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
                if (
                    child.status() != psutil.STATUS_ZOMBIE
                    and any(arg.endswith("cluster_main.py") for arg in child.cmdline())
                    and role in (None, child.environ().get("TRAINING_ROLE"))
                ):
                    alive.append(child)
            except psutil.NoSuchProcess:
                continue
        return alive

    @property
    def healthy(self) -> bool:
        """Every server and worker process is alive."""
        return len(self.members()) == self.cfg.cluster.servers + self.cfg.cluster.workers

    def restart(self) -> None:
        """Kill every process and start again: the workers restore the newest complete
        checkpoint chain and re-run the command that was in flight (its cursor did not move)."""
        log.warning("restarting the cluster")
        self.kill()
        self.start()

    def ensure_healthy(self) -> bool:
        """Restart the cluster if any of its processes died; True if it did."""
        if self.healthy:
            return False
        log.error(
            "cluster process lost: %d of %d alive; see %s",
            len(self.members()),
            self.cfg.cluster.servers + self.cfg.cluster.workers,
            self.log_dir,
        )
        self.restart()
        return True

    def stop(self, timeout_s: float = 60) -> None:
        """Stop within about ``timeout_s``: idle workers take a ``stop`` command and leave,
        and fleetrun exits with its servers. Busy workers, or a stop that does not finish
        in time, are killed with fleetrun's whole process group: the command in flight
        stays queued, and the next start restores the newest checkpoints and runs it."""
        if not self.running:
            return
        busy = self._busy_states()
        if busy:
            log.warning("workers busy (%s): killing the cluster; the next start resumes", busy)
            self.kill()
            return
        try:
            self.client.stop(timeout_s=timeout_s)
            assert self._proc is not None
            self._proc.wait(timeout_s)
        except (StreamrecError, subprocess.TimeoutExpired) as e:
            log.warning("cluster did not stop cleanly (%s); killing it", e)
            self.kill()

    def _busy_states(self) -> list[str]:
        """States of the workers that are not idle; a command the client saw finish may
        still show for a moment (its result is recorded before the worker turns idle)."""
        deadline = time.monotonic() + 2 * self.cfg.cluster.heartbeat_seconds
        while True:
            busy = [w["state"] for w in self.client.live_workers() if w.get("state") != "idle"]
            if not busy or time.monotonic() >= deadline:
                return busy
            time.sleep(0.1)

    def kill(self) -> None:
        """Kill fleetrun and every process it started."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrec cluster", description="Run the parameter-server cluster until Ctrl-C."
    )
    parser.add_argument(
        "--config", required=True, type=Path, help="pipeline YAML with real addresses"
    )
    args = parser.parse_args(argv)
    setup_logging()
    try:
        cfg = load_config(args.config)
        if cfg.uses_embedded_services:
            parser.error("the config says 'embedded': give real Kafka/Redis addresses")
        require_credentials(cfg.redis)  # before fleetrun: its workers would fail one by one
        resolved = dump_config(cfg, Path(cfg.paths.work_root) / "cluster.resolved.yaml")
        cluster = LocalCluster(cfg, resolved)
        stop_on_sigterm()
        try:
            cluster.start()
            while True:  # a lost server or worker restarts the whole cluster from checkpoints
                try:
                    cluster.ensure_healthy()
                except redis.RedisError as e:  # a restart needs Redis: try again when it is back
                    log.warning("cannot restart the cluster while Redis is away: %s", e)
                time.sleep(cfg.cluster.heartbeat_seconds)
        except KeyboardInterrupt:
            ignore_stop_signals()
            log.info("stopping the cluster (SIGTERM or Ctrl-C)")
            cluster.stop(timeout_s=cfg.cluster.stop_grace_seconds)
    except StreamrecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
