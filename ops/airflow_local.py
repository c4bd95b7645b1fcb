"""Airflow's real services on this machine: api-server, scheduler and dag-processor.

The live mode and the scheduler integration test run Airflow exactly as a deployment does,
as separate ``airflow`` processes (LocalExecutor, sqlite under ``<work_root>/airflow``),
not ``dag.test()``. Tasks reach the api-server's execution API; every process shares one
JWT secret. The UI login is written to the simple auth manager's password file, so it can
be printed. ``docker-compose.yml`` runs the same services on Postgres.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from streamrec.errors import ServiceError
from streamrec.ports import free_port
from streamrec.waiting import poll_until

log = logging.getLogger(__name__)

REPO_DAGS = Path(__file__).resolve().parent.parent / "dags"
COMPONENTS = ("api-server", "scheduler", "dag-processor")
USER = "admin"
# Airflow settings tuned for one pipeline's passes, each overridden by the same variable in
# the environment these services start from
TUNING = {
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    # the default 1 s idle loop adds ~0.5 s between each task and the next; 0.25 s costs
    # the idle scheduler 18% of a core instead of 6% (2026-11-27, 2-core machine)
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.25",
    # a scheduler restarted after a crash takes over the dead one's queued tasks at this
    # check, not at the default 300 s (the runs wait for them meanwhile)
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
}


def airflow_path() -> str:
    """The ``airflow`` next to this Python."""
    path = Path(sys.executable).with_name("airflow")
    if not path.exists():
        raise ServiceError("airflow is not installed here: pip install 'streamrec[airflow]'")
    return str(path)


@dataclass
class LocalAirflow:
    """Airflow's services for one pipeline config, started and stopped as processes."""

    home: Path
    config_path: Path
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(9))
    log_port: int = field(default_factory=free_port)  # the scheduler's task-log server
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    host: str = "127.0.0.1"  # the api-server's listen address, which tasks reach
    # what runs each ``airflow`` command (e.g. ``ip netns exec <host>``); nothing: directly
    command_prefix: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment every Airflow process (and so every task) runs with."""
        secret_file = self.home / "jwt_secret"
        if not secret_file.exists():
            secret_file.parent.mkdir(parents=True, exist_ok=True)
            secret_file.write_text(secrets.token_hex(32))
        return {
            **TUNING,
            **os.environ,  # an operator's own AIRFLOW__ settings win over TUNING
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": self.host,
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secret_file.read_text(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_port),
            "STREAMREC_CONFIG": str(self.config_path),
        }

    def api(self, path: str) -> dict:
        """GET ``/api/v2/<path>`` as the UI user (a token from the simple auth manager)."""
        login = json.dumps({"username": USER, "password": self.password}).encode()
        token_request = urllib.request.Request(
            f"{self.url}/auth/token", data=login, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(token_request, timeout=10) as reply:
            token = json.load(reply)["access_token"]
        request = urllib.request.Request(
            f"{self.url}/api/v2/{path}", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.load(reply)

    def migrate(self) -> None:
        """Create or upgrade the metadata database; write the UI login."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({USER: self.password}))
        out = subprocess.run(
            [*self.command_prefix, airflow_path(), "db", "migrate"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode:
            raise ServiceError(f"airflow db migrate failed:\n{out.stderr[-2000:]}")

    def start(self, component: str) -> None:
        """Start one service (``api-server``, ``scheduler`` or ``dag-processor``)."""
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{component}.out", "ab") as out:
            self.procs[component] = subprocess.Popen(
                [*self.command_prefix, airflow_path(), component],
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.home,
            )
        log.info("airflow %s started (pid %d)", component, self.procs[component].pid)

    def start_all(self, timeout_s: float = 120) -> None:
        """Migrate, start every service and wait until the api-server answers."""
        self.migrate()
        for component in COMPONENTS:
            self.start(component)

        def answers() -> bool | None:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ServiceError(
                        f"airflow {name} exited with {proc.returncode}; see "
                        f"{self.home / 'logs' / (name + '.out')}"
                    )
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=2):
                    return True
            except OSError:
                return None

        if poll_until(answers, timeout_s, 1.0) is None:
            raise ServiceError(f"the airflow api-server did not answer on {self.url}")

    def stop(self, component: str, timeout_s: float = 60) -> None:
        """SIGTERM one service (what systemd and compose send), SIGKILL if it lingers."""
        self._stop([component], timeout_s)

    def _stop(self, components: list[str], timeout_s: float) -> None:
        """SIGTERM every one of ``components`` at once, then wait for each within
        ``timeout_s`` of the signal, SIGKILL for one still running."""
        procs = {c: p for c in components if (p := self.procs.pop(c, None)) and p.poll() is None}
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        for component, proc in procs.items():
            try:
                proc.wait(max(0.0, timeout_s - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                log.warning("airflow %s outlived SIGTERM by %.0f s: killed", component, timeout_s)
            took = time.monotonic() - started
            log.info("airflow %s stopped %.1f s after SIGTERM", component, took)

    def stop_all(self, timeout_s: float = 30) -> None:
        """Stop the scheduler and the dag-processor together (the scheduler waits for running
        tasks), then the api-server, which those tasks report to."""
        self._stop([c for c in COMPONENTS if c != "api-server"], timeout_s)
        self._stop(["api-server"], timeout_s)

    def __enter__(self) -> LocalAirflow:
        try:
            self.start_all()
        except BaseException:  # the services started so far run in sessions of their own
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
