"""``streamrec demo --live`` as a user runs it: it prints the Airflow UI address and a login
that works, serves the UI, logs no ERROR on a normal start, and Ctrl-C stops everything it
started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = pytest.mark.slow


def test_live_demo_prints_a_working_login_and_stops_cleanly(repo: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    raw["schema"] = str(repo / "configs" / "schema.yaml")
    raw["model"] = str(repo / "configs" / "models" / "ctr_dnn.yaml")
    raw["paths"] = {k: str(tmp_path / k) for k in raw["paths"]}
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(raw))
    cli = str(Path(sys.executable).with_name("streamrec"))
    logged = tmp_path / "demo.log"
    with open(logged, "w") as log:
        proc = subprocess.Popen(
            [cli, "demo", "--live", "--config", str(config), "--rate", "50"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    started: list[psutil.Process] = []
    running = ""
    try:
        deadline = time.monotonic() + 300
        line = ""
        while "Airflow UI:" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "demo --live exited before serving"
        url, login = line.split("Airflow UI: ")[1].split("  (login: ")
        user, password = login.rstrip(")\n").split(" / ")
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=10) as r:
            health = json.load(r)
        assert health["metadatabase"]["status"] == "healthy"
        token = urllib.request.Request(
            f"{url}/auth/token",
            data=json.dumps({"username": user, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(token, timeout=10) as r:
            assert json.load(r)["access_token"]
        started = psutil.Process(proc.pid).children(recursive=True)
        assert any("scheduler" in " ".join(p.cmdline()) for p in started)
        assert any("cluster_main.py" in " ".join(p.cmdline()) for p in started)
    finally:
        running = logged.read_text()  # what the start logged, before the stop
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    assert code == 0
    assert running and not [line for line in running.splitlines() if " ERROR " in line], running
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
