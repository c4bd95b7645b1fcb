"""streamrec's small shared core: config, errors, logging, the pass contract, Redis keys,
the atomic filesystem adapter and local services. It imports nothing else of ours."""

from streamrec.config import PipelineConfig, dump_config, load_config, with_services
from streamrec.errors import ConfigError, ContractError, ServiceError, StreamrecError
from streamrec.redis_keys import RedisKeys

__all__ = [
    "ConfigError",
    "ContractError",
    "PipelineConfig",
    "RedisKeys",
    "ServiceError",
    "StreamrecError",
    "dump_config",
    "load_config",
    "with_services",
]
