"""The frame every ``streamrec`` subcommand runs in: one logging set-up, one signal handling
and one mapping from errors to the documented exit codes.

    0 ok; 1 failed; 2 bad configuration or arguments; 3 a service (Kafka, Redis, the
    cluster) cannot be reached; 4 data breaks its contract; 130 stopped (Ctrl-C, SIGTERM)

SIGUSR1 prints every thread's stack to stderr and the command goes on: where a command
that does not stop is waiting (``kill -USR1 <pid>``).

A Redis or Kafka client error that reaches the frame is an outage (3), or refused Redis
credentials (2, with the fix), whichever subcommand met it; any other exception is a bug
and keeps its traceback.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
from collections.abc import Callable

from streamrec.errors import ConfigError, ServiceError, StreamrecError
from streamrec.logs import setup_logging
from streamrec.signals import stop_on_sigterm

STOPPED = 130  # what a shell reports for a process ended by SIGINT
# kafka-python's errors for brokers that cannot be reached or do not answer in time (a
# client that cannot bootstrap raises KafkaTimeoutError)
_KAFKA_OUTAGES = (
    "KafkaConnectionError",
    "KafkaTimeoutError",
    "NodeNotReadyError",
    "RequestTimedOutError",
)


def as_streamrec_error(error: BaseException) -> StreamrecError | None:
    """``error`` as the StreamrecError its exit code comes from; None for a bug."""
    if isinstance(error, StreamrecError):
        return error
    # a client library that was never imported cannot have raised: no import for the check
    redis_errors = sys.modules.get("redis.exceptions")
    if redis_errors is not None and isinstance(error, redis_errors.RedisError):
        from streamrec.redis_conn import refused_credentials

        fix = refused_credentials(error)
        return ConfigError(fix) if fix else ServiceError(f"Redis: {error}")
    kafka_errors = sys.modules.get("kafka.errors")
    if kafka_errors is not None:
        outages = tuple(getattr(kafka_errors, name) for name in _KAFKA_OUTAGES)
        if isinstance(error, outages):
            return ServiceError(f"Kafka: {error}")
        refusals = (kafka_errors.AuthorizationError, kafka_errors.SaslAuthenticationFailedError)
        if isinstance(error, refusals):  # a stage that knows the keys says more (KafkaSource)
            return ServiceError(
                f"Kafka refused this client: {error}; check kafka.sasl_username and "
                "kafka.sasl_password_env / kafka.sasl_password_file, and the brokers' ACLs "
                "for that user"
            )
    return None


def run_command(body: Callable[[], int], stop: threading.Event | None = None) -> int:
    """Run a subcommand's ``body`` and return its exit code.

    SIGTERM (a service manager's stop) is handled as Ctrl-C: ``KeyboardInterrupt`` in the
    main thread, or, when ``stop`` is given, both signals set it and ``body`` winds down
    on its own."""
    setup_logging()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if stop is None:
        stop_on_sigterm()
    else:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        return body()
    except KeyboardInterrupt:
        return STOPPED
    except Exception as e:
        error = as_streamrec_error(e)
        if error is None:
            raise
    print(f"error: {error}", file=sys.stderr)
    return error.exit_code
