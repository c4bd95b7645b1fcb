"""Shared set-up of the benchmarks: a pipeline config on the local services, synthetic
passes built through the real broker and pass builder, and the reference's fleetrun jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from streaming.pass_builder import PassBuilder
from streaming.producer import produce_synthetic
from streamrec.config import (
    PathConfig,
    PipelineConfig,
    SchemaConfig,
    derived,
    dump_config,
    load_config,
    with_services,
)
from streamrec.ports import free_port
from trainers.hosts.node_processes import fleetrun_path

REPO = Path(__file__).resolve().parent.parent
STREAMREC = str(Path(sys.executable).with_name("streamrec"))  # the CLI in this venv
FIRST = "202601010000"


def bench_config(
    services, root: Path, name: str, events: int | None = None, **synthetic
) -> PipelineConfig:
    """The shipped config on ``services``, labels in the impressions, topics and directories
    (under ``root/name``) of its own; ``events`` synthetic impressions per pass if given."""
    cfg = with_services(
        load_config(REPO / "configs" / "pipeline.yaml"),
        services.bootstrap_servers,
        services.redis_url,
    )
    return derived(
        cfg,
        f"the {name} benchmark's config",
        name=name,
        join={"mode": "label_in_impression"},
        kafka={"impressions_topic": f"impressions-{name}"},
        synthetic={} if events is None else {"events_per_pass": events, **synthetic},
        paths=PathConfig.under(root / name),
    )


def delivering_every_pass(cfg: PipelineConfig, base_every_passes: int) -> PipelineConfig:
    """``cfg`` with the gate open (every pass is a version), the Redis sparse store, and a
    base save every ``base_every_passes`` (so the versions between are deltas)."""
    return derived(
        cfg,
        f"the {cfg.name} benchmark's delivery",
        checkpoints={"base_every_passes": base_every_passes},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
        serving={"sparse_store": "redis"},
    )


def build(cfg: PipelineConfig, passes: int, first: str = FIRST) -> list[str]:
    """Produce ``passes`` synthetic windows from ``first`` and build them; their pass ids."""
    ids = list(produce_synthetic(cfg, first, passes))
    builder = PassBuilder(cfg)
    try:
        builder.run(until_pass=ids[passes - 1], idle_timeout_s=60)
    finally:
        builder.close()
    return ids[:passes]


def tsv_line(schema: SchemaConfig, row: dict[str, Any]) -> str:
    """One row (label, slot values, dense values by name) as the reference reader's TSV:
    label, the dense values comma-separated, then one column per slot."""
    sparse = [",".join(row[s.name]) if s.multi else row[s.name] for s in schema.sparse]
    dense = ",".join(repr(row[d.name]) for d in schema.dense)
    return "\t".join([str(row["label"]), dense, *sparse]) + "\n"


def fleet_job(
    cfg: PipelineConfig, work: Path, script: str, *args: str, timeout_s: float = 900
) -> list[dict[str, Any]]:
    """Run ``bench/<script>`` under fleetrun with ``cfg``'s servers and workers (given
    ``--config`` and ``--out``, then ``args``); every worker's report. Raises SystemExit
    with the logs' tails when a worker did not report."""
    c = cfg.cluster
    work.mkdir(parents=True, exist_ok=True)
    resolved = dump_config(cfg, work / "reference.yaml")
    out, logs = work / "reference-out", work / "reference-logs"
    cmd = [
        fleetrun_path(),
        "--http_port",
        str(free_port()),
        "--servers",
        ",".join(f"127.0.0.1:{free_port()}" for _ in range(c.servers)),
        "--workers",
        ",".join(f"127.0.0.1:{free_port()}" for _ in range(c.workers)),
        "--log_dir",
        str(logs),
        str(REPO / "bench" / script),
        "--config",
        str(resolved),
        "--out",
        str(out),
        *args,
    ]
    env = {**os.environ, "PADDLE_WITH_GLOO": "1", "GLOG_minloglevel": "2", "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    with subprocess.Popen(
        cmd,
        env=env,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as fleetrun:
        try:
            fleetrun.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # fleetrun waits forever when a server dies
            os.killpg(fleetrun.pid, signal.SIGKILL)
        except BaseException:  # Ctrl-C or SIGTERM: fleetrun would leave its servers running
            os.killpg(fleetrun.pid, signal.SIGKILL)
            raise
    reports = [out / f"worker-{r}.json" for r in range(c.workers)]
    if not all(r.exists() for r in reports):  # fleetrun exits 0 when a worker fails
        tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*")))
        raise SystemExit(f"{script} failed:\n{tails}")
    return [json.loads(r.read_text()) for r in reports]


def with_settings(cfg: PipelineConfig, settings: list[str]) -> PipelineConfig:
    """``cfg`` with each ``dotted.key=value`` (the value read as YAML) set, validated again."""
    for setting in settings:
        key, _, value = setting.partition("=")
        section, *path = key.split(".")
        change = yaml.safe_load(value)
        for name in reversed(path):
            change = {name: change}
        cfg = derived(cfg, f"--set {setting}", **{section: change})
    return cfg
