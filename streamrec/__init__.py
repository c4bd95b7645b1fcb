"""streamrec's small shared core: config, errors, logging, the pass contract, Redis keys,
the atomic filesystem adapter and local services. It imports nothing else of ours."""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers see; at run time a name's module loads on first use
    from streamrec.config import (
        PipelineConfig as PipelineConfig,
        dump_config as dump_config,
        load_config as load_config,
        with_services as with_services,
    )
    from streamrec.errors import (
        ConfigError as ConfigError,
        ContractError as ContractError,
        ServiceError as ServiceError,
        StreamrecError as StreamrecError,
    )
    from streamrec.redis_keys import RedisKeys as RedisKeys


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
