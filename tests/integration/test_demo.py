"""The README's main command, end to end, as a user runs it (embedded services)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def test_demo_runs_the_whole_loop(repo: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    raw["schema"] = str(repo / "configs" / "schema.yaml")
    raw["model"] = str(repo / "configs" / "models" / "ctr_dnn.yaml")
    raw["paths"] = {
        k: str(tmp_path / k) for k in ("data_root", "checkpoint_root", "model_root", "work_root")
    }
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = subprocess.run(
        [sys.executable, "-m", "demo", "--config", str(config), "--passes", "3"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=repo,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip().startswith("2026")]
    assert len(rows) == 3
    # pass rows keys save AUC best train-AUC logloss COPC gate delivered seconds
    keys = [int(r[2]) for r in rows]
    assert 0 < keys[0] < keys[1] < keys[2]  # the table grows with the stream's new ids
    assert [r[3] for r in rows] == ["base", "delta", "delta"]
    aucs = [float(r[4]) for r in rows]
    best = [float(r[5]) for r in rows]
    assert aucs[-1] > 0.7 and all(a < b + 0.02 for a, b in zip(aucs, best, strict=True))
    assert any(r[10] != "-" for r in rows), "no pass was delivered"
    scored = [line for line in out.stdout.splitlines() if "p(click)=" in line]
    assert len(scored) == 5
    assert all(0.0 < float(line.split("p(click)=")[1].split()[0]) < 1.0 for line in scored)
    assert (tmp_path / "model_root" / "ctr_dnn").is_dir()
