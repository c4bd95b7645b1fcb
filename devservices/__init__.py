"""Development tooling, not the pipeline: the services a developer's machine runs for the
local demo, the tests and the benchmarks (Apache Kafka installed from Maven Central and run
in KRaft mode, a redis-server on loopback), each on a free port and waited for until it
answers. A deployment runs its own broker and Redis and never imports this package.
"""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers see; at run time a name's module loads on first use
    from devservices.kafka_broker import (
        start_kafka as start_kafka,
        start_kafka_cluster as start_kafka_cluster,
    )
    from devservices.local_services import (
        LocalServices as LocalServices,
        local_services as local_services,
        start_redis as start_redis,
    )
    from devservices.processes import RunningService as RunningService

_EXPORTS = {
    "LocalServices": "devservices.local_services",
    "RunningService": "devservices.processes",
    "local_services": "devservices.local_services",
    "start_kafka": "devservices.kafka_broker",
    "start_kafka_cluster": "devservices.kafka_broker",
    "start_redis": "devservices.local_services",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
