"""Each package declares its public surface, and importing it does no heavy work."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ["streamrec", "streaming", "trainers", "serving_export", "ops"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__, f"{name} declares no public names"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, missing


def test_importing_packages_does_not_import_paddle_or_airflow() -> None:
    code = (
        "import sys, streamrec, streaming, trainers, serving_export, ops;"
        "heavy = [m for m in ('paddle', 'airflow') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


_PROBE = """
import importlib, sys
importlib.import_module({module!r})
bad = [m for m in sys.modules if m.split(".")[0] in {forbidden!r}]
assert not bad, bad
"""


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("streamrec", ("streaming", "trainers", "serving_export", "ops", "dags", "demo")),
        ("streamrec.local_services", ("streaming", "trainers", "serving_export", "ops")),
        # every command's frame: no stage, and no client library it does not need
        ("streamrec.entry", ("streaming", "trainers", "serving_export", "ops", "kafka", "redis")),
        ("streaming", ("trainers", "serving_export", "ops", "dags", "demo")),
        ("trainers", ("serving_export", "ops", "dags", "demo")),
        ("serving_export", ("ops", "dags", "demo")),
        ("ops.cli", ("paddle", "airflow", "dags", "demo")),
        ("ops.retention", ("paddle", "dags", "demo")),
        ("ops.charts", ("paddle", "airflow", "dags", "demo")),
    ],
)
def test_stage_imports_flow_one_way(module: str, forbidden: tuple[str, ...]) -> None:
    """A stage imports only earlier stages and the core; the core imports no stage; the
    operator CLI starts without paddle or Airflow."""
    code = _PROBE.format(module=module, forbidden=forbidden)
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
