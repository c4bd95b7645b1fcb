"""Each package declares its public surface, and importing it does no heavy work."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ["streamrec", "streaming", "trainers", "serving_export", "ops", "devservices"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__, f"{name} declares no public names"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, missing


@pytest.mark.parametrize("name", PACKAGES)
def test_type_checkers_see_every_lazy_export(name: str) -> None:
    """Each lazy export is imported under ``TYPE_CHECKING`` from the module it loads from at
    run time, so a type checker sees the public names (``__getattr__`` would type them Any)."""
    tree = ast.parse(Path(importlib.import_module(name).__file__ or "").read_text())
    exports = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS"
    )
    checked = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    )
    seen = {
        alias.asname or alias.name: node.module
        for node in checked.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == exports


def test_importing_packages_does_not_import_paddle_or_airflow() -> None:
    code = (
        "import sys, streamrec, streaming, trainers, serving_export, ops;"
        "heavy = [m for m in ('paddle', 'airflow') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# the module and every public name it exports: a lazy export imports its module only here
_PROBE = """
import importlib, sys
module = importlib.import_module({module!r})
for name in getattr(module, "__all__", ()):
    getattr(module, name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
assert not bad, bad
"""


def probe(module: str, forbidden: tuple[str, ...], cwd: Path | None = None) -> str | None:
    """Import ``module`` and everything it exports in a fresh interpreter; what it loaded of
    ``forbidden`` (its error), or None."""
    code = _PROBE.format(module=module, forbidden=forbidden)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
    return run.stderr if run.returncode else None


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("streamrec", ("streaming", "trainers", "serving_export", "ops", "devservices", "demo")),
        ("streamrec.network", ("paddle", "streaming", "trainers", "serving_export", "ops")),
        ("devservices", ("streaming", "trainers", "serving_export", "ops", "dags", "demo")),
        # the core starts no local service: development tooling is above it
        ("streamrec.ports", ("devservices", "streaming", "trainers", "serving_export", "ops")),
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
    """A stage and all it exports import only earlier stages and the core; the core imports
    no stage; the operator CLI starts without paddle or Airflow."""
    assert probe(module, forbidden) is None


def test_the_probe_fails_on_a_lazy_export_against_the_order(tmp_path: Path) -> None:
    """A package whose ``__init__`` loads nothing until a name is used still fails."""
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "__init__.py").write_text("")
    (tmp_path / "high" / "thing.py").write_text("THING = 1\n")
    lazy = (
        "from streamrec.lazy import lazy_exports\n"
        "__all__, __getattr__ = lazy_exports(__name__, {{'THING': '{target}'}})\n"
    )
    (tmp_path / "low" / "__init__.py").write_text(lazy.format(target="low.thing"))
    (tmp_path / "low" / "thing.py").write_text("THING = 1\n")
    assert probe("low", ("high",), cwd=tmp_path) is None
    (tmp_path / "low" / "__init__.py").write_text(lazy.format(target="high.thing"))
    found = probe("low", ("high",), cwd=tmp_path)
    assert found is not None and "high.thing" in found
