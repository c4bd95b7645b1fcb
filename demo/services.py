"""The demos' services: embedded ones started on loopback when the config says so."""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from pathlib import Path

from devservices.local_services import local_services
from streamrec.config import PipelineConfig, with_services


def on_local_services(cfg: PipelineConfig, stack: ExitStack) -> PipelineConfig:
    """With ``embedded`` services in ``cfg``: empty its directories (a new embedded broker
    holds nothing to resume from), start a broker and a redis-server for the life of
    ``stack``, and return ``cfg`` pointing at them. Otherwise ``cfg`` as it is."""
    if not cfg.uses_embedded_services:
        return cfg
    work = Path(cfg.paths.work_root)
    for p in (cfg.paths.data_root, cfg.paths.checkpoint_root, cfg.paths.model_root, work):
        shutil.rmtree(p, ignore_errors=True)
    svc = stack.enter_context(local_services(work / "services"))
    return with_services(cfg, svc.bootstrap_servers, svc.redis_url)
