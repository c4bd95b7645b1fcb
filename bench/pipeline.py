"""Shared set-up of the benchmarks: a pipeline config on the local services, and synthetic
passes built through the real broker and pass builder."""

from __future__ import annotations

from pathlib import Path

from streaming.pass_builder import PassBuilder
from streaming.producer import produce_synthetic
from streamrec.config import PipelineConfig, load_config, with_services

REPO = Path(__file__).resolve().parent.parent
FIRST = "202601010000"


def section(cfg: PipelineConfig, name: str, **values) -> PipelineConfig:
    return cfg.model_copy(update={name: getattr(cfg, name).model_copy(update=values)})


def bench_config(services, root: Path, name: str, events: int, **synthetic) -> PipelineConfig:
    cfg = with_services(
        load_config(REPO / "configs" / "pipeline.yaml"),
        services.bootstrap_servers,
        services.redis_url,
    )
    cfg = cfg.model_copy(update={"name": name})
    cfg = section(cfg, "join", mode="label_in_impression")
    cfg = section(cfg, "kafka", impressions_topic=f"impressions-{name}")
    cfg = section(cfg, "synthetic", events_per_pass=events, **synthetic)
    return section(
        cfg,
        "paths",
        data_root=root / name / "data",
        checkpoint_root=root / name / "checkpoints",
        model_root=root / name / "models",
        work_root=root / name / "run",
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
