"""streamrec's small shared core: config, errors, logging, the pass contract, Redis keys,
the atomic filesystem adapter and local services. It imports nothing else of ours."""

import importlib
from typing import Any

# Exports load on first use (PEP 562), so importing one module of the package, as the
# pipe reader process or a DAG file does, does not import the whole stage.
_EXPORTS = {
    "ConfigError": "streamrec.errors",
    "ContractError": "streamrec.errors",
    "PipelineConfig": "streamrec.config",
    "RedisKeys": "streamrec.redis_keys",
    "ServiceError": "streamrec.errors",
    "StreamrecError": "streamrec.errors",
    "dump_config": "streamrec.config",
    "load_config": "streamrec.config",
    "with_services": "streamrec.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
