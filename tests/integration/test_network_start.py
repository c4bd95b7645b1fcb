"""``streamrec cluster`` refuses a network it cannot train before anything starts: a module
that does not import, a hyper-parameter the network does not declare or of the wrong type,
a logit of the wrong shape. Each is exit 2 with the key named, within the check's time and
with no cluster process left; the services the config names are never reached (none runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

pytestmark = pytest.mark.timeout(300)

CLI = str(Path(sys.executable).with_name("streamrec"))
OUTSIDE = Path(__file__).parent / "outside"
ENGINE_KEYS = {"sparse_feature_dim", "optimizer", "sparse_table"}


def _config(repo: Path, tmp_path: Path, network: str, **params: Any) -> Path:
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    raw["schema"] = yaml.safe_load((repo / "configs" / "schema.yaml").read_text())
    model = yaml.safe_load((repo / "configs" / "models" / "ctr_dnn.yaml").read_text())
    model["model"], model["network"] = "mine", network
    model["hyper_parameters"] = {
        **{k: v for k, v in model["hyper_parameters"].items() if k in ENGINE_KEYS},
        **params,
    }
    raw["model"] = model
    raw["kafka"]["bootstrap_servers"] = "127.0.0.1:9"  # discard: nothing may reach it
    raw["redis"]["url"] = "redis://127.0.0.1:9/0"
    raw["paths"] = {k: str(tmp_path / k) for k in raw["paths"]}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("network", "params", "key", "fix"),
    [
        ("team_nets.ranking:Net", {}, "model.network", "PYTHONPATH"),
        ("broken_nets:NoSuchNet", {}, "model.network", "'module:Class'"),
        ("broken_nets:WrongShape", {"widht": 1}, "model.hyper_parameters.widht", "spelling"),
        ("broken_nets:WrongShape", {"width": 0}, "model.hyper_parameters.width", "greater"),
        ("broken_nets:WrongShape", {"width": 4}, "model.network", "shape [-1, 4]"),
        ("ctr_dnn", {"fc_sizes": "wide"}, "model.hyper_parameters.fc_sizes", "valid list"),
    ],
)
def test_cluster_start_refuses_the_network_naming_the_key(
    repo: Path, tmp_path: Path, network: str, params: dict[str, Any], key: str, fix: str
) -> None:
    config = _config(repo, tmp_path, network, **params)
    env = {**os.environ, "PYTHONPATH": str(OUTSIDE)}
    done = subprocess.run(
        [CLI, "cluster", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert key in done.stderr and fix in done.stderr, done.stderr[-3000:]
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(config) in " ".join(p.info["cmdline"] or [])
        and "fleetrun" in " ".join(p.info["cmdline"] or [])
    ]


def test_a_network_in_the_folder_streamrec_starts_in_is_found(repo: Path, tmp_path: Path) -> None:
    """No PYTHONPATH: started in the network's folder, the module imports (as uvicorn finds
    an app), so the failure is the network's own shape, not its import."""
    config = _config(repo, tmp_path, "broken_nets:WrongShape", width=2)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [CLI, "cluster", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=OUTSIDE,
    )
    assert done.returncode == 2 and "shape [-1, 2]" in done.stderr, done.stderr[-3000:]


def test_cluster_start_refuses_a_schema_its_network_cannot_read(repo: Path, tmp_path: Path) -> None:
    """DIN (``examples/din``) on the shipped schema, which has no history slot: the
    network's declared needs fail the start with exit 2 naming the slot and the fix, before
    anything is built or started (no ``KeyError`` from the cluster's first build)."""
    config = _config(repo, tmp_path, "din:Din")
    env = {**os.environ, "PYTHONPATH": str(repo / "examples" / "din")}
    done = subprocess.run(
        [CLI, "cluster", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "schema.sparse: din:Din reads the slot 'clicked_items' as a sequence" in done.stderr
    assert "KeyError" not in done.stderr
