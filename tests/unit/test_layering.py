"""The layering of docs/ARCHITECTURE.md, checked from the source: every import of every
module (at the top, inside a function, under TYPE_CHECKING) and every module of ours named
by a string (``importlib.import_module``, the packages' lazy ``_EXPORTS``, a command table)
goes only to the same package or one below it. Static: a lazy import that a run never
reaches is still read. Shown to fail on an import injected against the order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# each folder and the folders of ours it may import (docs/ARCHITECTURE.md, "may import")
MAY_IMPORT: dict[str, frozenset[str]] = {
    "streamrec": frozenset(),
    "streaming": frozenset({"streamrec"}),
    "trainers": frozenset({"streamrec", "streaming"}),
    "serving_export": frozenset({"streamrec", "streaming", "trainers"}),
    "ops": frozenset({"streamrec", "streaming", "trainers", "serving_export"}),
    "demo": frozenset({"streamrec", "streaming", "trainers", "serving_export", "ops"}),
    "dags": frozenset({"streamrec", "streaming", "trainers", "serving_export", "ops"}),
}


def _docstrings(tree: ast.Module) -> set[int]:
    """Ids of the docstring nodes (prose, not module names)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def _is_module(root: Path, name: str) -> bool:
    """Whether ``name`` (dotted) is a module or package of ours under ``root``."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, module) of everything ``path`` imports or names as a module of ours."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    package = path.relative_to(root).parts[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            found.append((node.lineno, f"{package}.{module}" if node.level else module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
        elif (  # a dotted module path in a string: a lazy export, a command table
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and "." in node.value
            and node.value.split(".")[0] in MAY_IMPORT
            and _is_module(root, node.value)
        ):
            found.append((node.lineno, node.value))
    return sorted(set(found))  # a name given to import_module is a string constant too


def violations(root: Path) -> list[str]:
    """Every import against the order under ``root``, as ``path:line: a -> b``."""
    bad = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, module in imports_of(root, path):
                target = module.split(".")[0]
                if target in MAY_IMPORT and target != package and target not in allowed:
                    bad.append(f"{path.relative_to(root)}:{line}: {package} -> {module}")
    return bad


def test_every_import_follows_the_order() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("package", "line"),
    [
        ("streaming", "from ops.status import recent_passes\n"),  # at the top
        ("trainers", "def f():\n    from serving_export import delivery\n"),  # lazy
        ("streamrec", 'import importlib\nimportlib.import_module("streaming.events")\n'),
        ("serving_export", '_EXPORTS = {"x": "ops.status"}\n'),  # a lazy export table
    ],
)
def test_an_import_injected_against_the_order_fails(
    tmp_path: Path, package: str, line: str
) -> None:
    for name in MAY_IMPORT:  # a tree with every package, each with the modules named
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    for module in ("ops/status.py", "serving_export/delivery.py", "streaming/events.py"):
        (tmp_path / module).write_text("")
    assert violations(tmp_path) == []
    (tmp_path / package / "injected.py").write_text(line)
    [found] = violations(tmp_path)
    assert found.startswith(f"{package}/injected.py:") and f"{package} -> " in found
