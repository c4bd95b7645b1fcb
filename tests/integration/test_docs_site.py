"""The documentation site as a reader gets it: ``mkdocs serve`` on loopback, its
configuration reference opened in Debian's chromium (a screenshot kept with the test's
files). The reference is generated from the config models at build, so every key a config
can hold is on the page with its type, default and description; and ``mkdocs build
--strict`` (the test command runs it) fails on a broken link."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path

import httpx
import pytest
from browser import open_document
from pydantic import BaseModel

from streamrec.config import PipelineConfig
from streamrec.ports import free_port

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
MKDOCS = str(Path(sys.executable).with_name("mkdocs"))
QUIET = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


def _keys(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Every key of ``model`` and of the sections it holds -> its description."""
    keys = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        keys[key] = field.description or ""
        annotation = field.annotation
        listed = typing.get_origin(annotation) in (list, tuple)
        for arg in [annotation, *typing.get_args(annotation)]:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                keys |= _keys(arg, f"{key}{'[]' if listed else ''}.")
    return keys


def test_the_configuration_reference_shows_every_key_in_chromium(tmp_path: Path) -> None:
    port = free_port()
    serve = subprocess.Popen(
        [MKDOCS, "serve", "--no-livereload", "--strict", "-a", f"127.0.0.1:{port}"],
        cwd=REPO,
        env=QUIET,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}/reference/config/"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "mkdocs serve did not answer"
            time.sleep(0.3)
        shot = tmp_path / "config-reference.png"
        page = open_document(url, screenshot=shot)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert not page.errors, page.errors
    assert page.title == "Configuration - streamrec", page.title
    shown = {row[0]: row for row in page.rows if len(row) == 4 and row[0] != "key"}
    expected = _keys(PipelineConfig)
    # a top-level section is a heading of its own, its keys the rows of its table
    sections = {
        k for k in expected if "." not in k and any(e.startswith(f"{k}.") for e in expected)
    }
    assert sections >= {"kafka", "passes", "cluster", "serving"}
    expected = {k: v for k, v in expected.items() if k not in sections}
    assert set(shown) == set(expected), (set(expected) - set(shown), set(shown) - set(expected))
    for key, description in expected.items():
        # `code` in a description is drawn as code, without its backticks
        assert shown[key][3] == " ".join(description.replace("`", "").split()), key
    assert shown["passes.pass_seconds"][1:3] == ["int", "required"]
    assert shown["serving.max_in_flight"][2] == "256"
    assert shot.stat().st_size > 50_000  # a page of tables, not a blank one


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(REPO / "docs", site / "docs")
    shutil.copytree(REPO / "configs", site / "configs")  # the metrics reference reads one
    shutil.copy(REPO / "mkdocs.yml", site)
    build = [MKDOCS, "build", "--strict", "--site-dir", str(tmp_path / "out")]
    env = {**QUIET, "PYTHONPATH": str(REPO)}  # mkdocstrings reads the packages from here
    # the copy's mkdocstrings paths point at the copy: the packages are read from the repo
    config = (site / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{REPO}]")
    (site / "mkdocs.yml").write_text(config)
    whole = subprocess.run(build, cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0, whole.stderr[-3000:]
    page = site / "docs" / "concepts" / "passes.md"
    page.write_text(page.read_text() + "\nSee [the missing page](missing.md).\n")
    broken = subprocess.run(build, cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert broken.returncode != 0
    assert "missing.md" in broken.stderr, broken.stderr[-3000:]
