"""The layering of docs/ARCHITECTURE.md, checked from the source: every import of every
module (at the top, inside a function, under TYPE_CHECKING) and every module of ours named
by a string (``importlib.import_module``, the packages' lazy ``_EXPORTS``, a command table,
a ``module:attr`` import path) goes only to the same folder or one its row of the table
allows. The table is read, not copied. Static: a lazy import that a run never reaches is
still read. Shown to fail on an import injected against the order."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| folder | owns | may import |"


def may_import(architecture: Path) -> dict[str, frozenset[str]]:
    """Each folder of ARCHITECTURE.md's layering table and the folders it may import: the
    backticked folder names of its last column."""
    lines = architecture.read_text().splitlines()
    start = lines.index(HEADER) + 2  # past the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        folder, *_, allowed = (cell.strip() for cell in line.strip("|").split(" | "))
        rows.append((folder.strip("`/"), set(re.findall(r"`([^`]+)`", allowed))))
    folders = {folder for folder, _ in rows}
    return {folder: frozenset(allowed & folders) for folder, allowed in rows}


MAY_IMPORT = may_import(ROOT / "docs" / "ARCHITECTURE.md")


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


def _named_module(text: str) -> str | None:
    """The module of ours a string names: a dotted module path, or the module part of an
    import path ``module:attr``."""
    module, colon, attr = text.partition(":")
    if colon and not attr.isidentifier():
        return None
    if module.split(".")[0] not in MAY_IMPORT or not (colon or "." in module):
        return None
    return module


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
        elif (  # a lazy export, a command table, an import path ``module:attr``
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (module := _named_module(node.value))
            and _is_module(root, module)
        ):
            found.append((node.lineno, module))
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


def test_the_table_names_every_folder_of_code() -> None:
    """Every top folder holding Python but the tests has a row, so none escapes the check."""
    code = {
        p.relative_to(ROOT).parts[0]
        for p in ROOT.glob("*/**/*.py")
        if not p.relative_to(ROOT).parts[0].startswith(".")
    }
    assert code - {"tests"} <= set(MAY_IMPORT), code - set(MAY_IMPORT)
    assert MAY_IMPORT["streamrec"] == frozenset() and "dags" not in set().union(
        *MAY_IMPORT.values()
    )


def test_every_import_follows_the_order() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("package", "line"),
    [
        ("streaming", "from ops.status import recent_passes\n"),  # at the top
        ("trainers", "def f():\n    from serving_export import delivery\n"),  # lazy
        ("streamrec", 'import importlib\nimportlib.import_module("streaming.events")\n'),
        ("serving_export", '_EXPORTS = {"x": "ops.status"}\n'),  # a lazy export table
        ("streamrec", 'NETWORKS = {"dnn": "trainers.networks:CtrDnn"}\n'),  # an import path
        ("bench", "from dags import streamrec_pass\n"),  # a benchmark importing the DAG
        ("examples", "from trainers.networks import mlp\n"),  # a network past the API
    ],
)
def test_an_import_injected_against_the_order_fails(
    tmp_path: Path, package: str, line: str
) -> None:
    for name in MAY_IMPORT:  # a tree with every folder, each with the modules named
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    for module in (
        "ops/status.py",
        "serving_export/delivery.py",
        "streaming/events.py",
        "trainers/networks.py",
        "dags/streamrec_pass.py",
    ):
        (tmp_path / module).write_text("")
    assert violations(tmp_path) == []
    (tmp_path / package / "injected.py").write_text(line)
    [found] = violations(tmp_path)
    assert found.startswith(f"{package}/injected.py:") and f"{package} -> " in found


def test_a_string_that_only_looks_like_a_path_is_not_an_import() -> None:
    assert _named_module("trainers.networks:CtrDnn") == "trainers.networks"
    assert _named_module("streaming.events") == "streaming.events"
    assert _named_module("see trainers.networks: it") is None
    assert _named_module("trainers") is None and _named_module("numpy.linalg:norm") is None
