"""docker-compose.yml describes the deployment; Debian's docker-compose validates it
without an engine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


def test_compose_file_is_valid_and_complete(repo: Path) -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed; scripts/setup.sh installs it")
    out = subprocess.run(
        [exe, "-f", str(repo / "docker-compose.yml"), "--profile", "serving", "config"],
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,
    )
    services = yaml.safe_load(out.stdout)["services"]
    assert {
        "kafka",
        "redis",
        "airflow",
        "pserver-0",
        "trainer-0",
        "trainer-1",
        "serving",
        "pass-builder",
    } <= set(services)
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    roles = {
        name: s["environment"].get("TRAINING_ROLE")
        for name, s in services.items()
        if name.startswith(("pserver", "trainer"))
    }
    assert roles == {"pserver-0": "PSERVER", "trainer-0": "TRAINER", "trainer-1": "TRAINER"}
