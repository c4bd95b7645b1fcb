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

# 90 s in a parallel suite, and over the default 180 s beside the chaos soak (2026-11-27)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# the stop's own bounds, one after another: the stream's thread 30 s, Airflow's scheduler and
# dag-processor 30 s, its api-server 30 s, the pass builder 30 s, the cluster 60 s
STOP_S = 180


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
        try:
            code = proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            # what it is waiting in: its signal masks (a blocked or ignored SIGINT) and
            # every thread's stack (the entry frame dumps them on SIGUSR1)
            masks = [
                line
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
            ]
            proc.send_signal(signal.SIGUSR1)
            time.sleep(3)
            proc.kill()
            tail = logged.read_text()[-12000:]
            pytest.fail(f"still running {STOP_S} s after Ctrl-C; {masks}; its log ends:\n{tail}")
    assert code == 0
    assert running and not [line for line in running.splitlines() if " ERROR " in line], running
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
