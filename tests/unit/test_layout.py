"""The on-disk layout has one home (``streamrec.layout``): its folders are where its
docstring says, and no other module of ours spells a folder name of it or cuts a pass's
day out of its id (a static check, shown to fail on an injected one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from streamrec.config import PathConfig
from streamrec.layout import Layout, day_of
from streamrec.passes import pass_dir, slice_dir

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("streamrec", "streaming", "trainers", "serving_export", "ops", "dags", "demo")
FOLDERS = {"passes", "slices", "exports", "scores", "cluster-logs", "pass-text", "metric-dumps"}
P = "202601010010"


def test_the_folders_are_where_the_layout_says(tmp_path: Path) -> None:
    layout = Layout.of(PathConfig.under(tmp_path))
    data, work = tmp_path / "data", layout.work_root
    assert day_of(P) == "20260101"
    assert layout.data.pass_dir(P) == pass_dir(data, P) == data / "passes" / "20260101" / P
    assert slice_dir(data, P, 3) == data / "slices" / "20260101" / P / "p3"
    assert layout.export_dir(P, "c1") == work / "exports" / f"{P}-c1"
    assert layout.cluster_logs == work / "cluster-logs"
    assert layout.model_dir("ctr") == tmp_path / "models" / "ctr"


def spelt_elsewhere(root: Path, source: str, name: str) -> list[str]:
    """Where ``source`` (a module's text) joins a layout folder to a path (``x / "exports"``)
    or cuts ``[:8]`` of a pass id."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            spelt = [s for s in (node.left, node.right) if isinstance(s, ast.Constant)]
            found += [f"{name}:{node.lineno} {s.value!r}" for s in spelt if s.value in FOLDERS]
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Slice)
            and node.slice.lower is None
            and isinstance(node.slice.upper, ast.Constant)
            and node.slice.upper.value == 8
            and "pass" in ast.unparse(node.value)
        ):
            found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    return found


def _ours() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_no_module_but_the_layout_spells_a_folder_of_it() -> None:
    found = [
        hit
        for path in _ours()
        if path != ROOT / "streamrec" / "layout.py"
        for hit in spelt_elsewhere(ROOT, path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, found


@pytest.mark.parametrize(
    "injected",
    [
        'logs = work / "cluster-logs"\n',
        'root = Path(data_root) / "passes"\n',
        "day = pass_id[:8]\n",
    ],
)
def test_the_check_fails_on_an_injected_spelling(injected: str) -> None:
    assert spelt_elsewhere(ROOT, injected, "injected.py")
