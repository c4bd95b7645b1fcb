"""The cost of a team's own network: the DIN example (``examples/din``) against the shipped
``ctr_dnn`` (the baseline, measured in the same run) on the same passes of the example's
stream, each on a fresh cluster of the example's shape.

    PYTHONPATH=examples/din .venv/bin/python bench/networks.py [--passes 4] [--rows 100000]

Per network: the seconds of the training run (the ``train`` stage) and of the whole
``train`` command per 100,000 rows, over every pass after the first (a fresh cluster's
first pass warms its tables), and the progressive AUC of the last pass. Ends with
``RESULT din_train_seconds_per_100k_rows``, ``RESULT ctr_dnn_train_seconds_per_100k_rows``,
``RESULT din_over_ctr_dnn_train`` and the same for the command.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from machine import hardware_line
from pipeline import REPO, build

from devservices.local_services import local_services
from streamrec.config import (
    PathConfig,
    PipelineConfig,
    derived,
    dump_config,
    load_config,
    with_services,
)
from trainers.launcher import LocalCluster

EXAMPLE = REPO / "examples" / "din"
PER = 100_000


def _baseline(din: PipelineConfig) -> PipelineConfig:
    """The same pipeline training ctr_dnn: the engine's settings, the MLP's widths."""
    data = din.model_dump(mode="json", by_alias=True)
    hp = data["model"]["hyper_parameters"]
    data["model"].update(model="ctr_dnn", network="ctr_dnn")
    data["model"]["hyper_parameters"] = {
        **{k: hp[k] for k in ("sparse_feature_dim", "optimizer", "sparse_table")},
        "fc_sizes": hp["fc_sizes"],
    }
    data["name"] = "bench-ctr-dnn"
    return PipelineConfig.model_validate(data)


def _run(cfg: PipelineConfig, root: Path, passes: list[str]) -> dict[str, float]:
    cfg = derived(
        cfg,
        f"the {cfg.model.model} run",
        paths={"checkpoint_root": root / "checkpoints", "work_root": root / "run"},
    )
    resolved = dump_config(cfg, root / "pipeline.yaml")
    train_s = command_s = 0.0
    rows = 0
    auc = 0.0
    with LocalCluster(cfg, resolved) as cluster:
        for i, pass_id in enumerate(passes):
            start = time.perf_counter()
            result = cluster.client.train(pass_id)
            elapsed = time.perf_counter() - start
            print(
                f"  {cfg.model.model:8} {pass_id}  rows {result.rows:7d}  train "
                f"{result.seconds['train']:6.2f} s  command {elapsed:6.2f} s  "
                f"AUC {result.test.auc:.4f}"
            )
            if i > 0:
                train_s += result.seconds["train"]
                command_s += elapsed
                rows += result.rows
            auc = result.test.auc
    return {"train": train_s * PER / rows, "command": command_s * PER / rows, "auc": auc}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=4, help="passes (the first not counted)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per pass")
    args = parser.parse_args()
    print(hardware_line())
    with (
        tempfile.TemporaryDirectory(prefix="bench-networks-") as tmp,
        local_services(Path(tmp) / "services") as services,
    ):
        root = Path(tmp)
        din = with_services(
            load_config(EXAMPLE / "pipeline.yaml"), services.bootstrap_servers, services.redis_url
        )
        din = derived(
            din,
            "the benchmark's DIN pipeline",
            name="bench-din",
            synthetic={"events_per_pass": args.rows},
            paths=PathConfig.under(root / "din"),
        )
        passes = build(din, args.passes)
        figures = {
            "din": _run(din, root / "din-run", passes),
            "ctr_dnn": _run(_baseline(din), root / "ctr-dnn-run", passes),
        }
    for name, f in figures.items():
        print(
            f"{name:8} train {f['train']:.2f} s / 100k rows, command {f['command']:.2f} s / "
            f"100k rows, last pass AUC {f['auc']:.4f}"
        )
    din_f, dnn_f = figures["din"], figures["ctr_dnn"]
    print(f"RESULT din_train_seconds_per_100k_rows {din_f['train']:.3f}")
    print(f"RESULT ctr_dnn_train_seconds_per_100k_rows {dnn_f['train']:.3f}")
    print(f"RESULT din_over_ctr_dnn_train {din_f['train'] / dnn_f['train']:.3f}")
    print(f"RESULT din_command_seconds_per_100k_rows {din_f['command']:.3f}")
    print(f"RESULT ctr_dnn_command_seconds_per_100k_rows {dnn_f['command']:.3f}")
    print(f"RESULT din_over_ctr_dnn_command {din_f['command'] / dnn_f['command']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
