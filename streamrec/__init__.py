"""streamrec's small shared core: config, errors, logging, the pass contract, Redis keys,
the atomic filesystem adapter and local services. It imports nothing else of ours."""

from streamrec.lazy import lazy_exports

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
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
