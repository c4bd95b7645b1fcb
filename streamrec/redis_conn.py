"""Clients of the pipeline's Redis, built in one place from ``redis`` in the config: its
URL, ACL user and password (read from the environment or a file, ``streamrec.secrets``)."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from streamrec.config import RedisConfig
from streamrec.errors import ConfigError, ServiceError
from streamrec.secrets import redact_url


def connect(rc: RedisConfig, *, decode: bool = True, ride_out_s: float = 0.0) -> redis.Redis:
    """A client of ``rc``'s Redis returning str values (bytes with ``decode=False``).

    With ``ride_out_s``, a command that meets a lost connection is retried (backoff up to
    1 s) for about that long: a long-running process rides out a Redis restart instead of
    failing. Only for callers whose writes are idempotent (a retried write may have been
    applied once already)."""
    extra = {}
    if ride_out_s > 0:
        extra["retry"] = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=int(ride_out_s) + 5)
    return redis.Redis.from_url(
        rc.url,
        username=rc.username,
        password=rc.password(),
        decode_responses=decode,
        socket_timeout=30,
        **extra,
    )


def refused_credentials(e: redis.RedisError) -> str | None:
    """The fix to print when ``e`` is Redis refusing our credentials, else None."""
    if isinstance(e, redis.AuthenticationError | redis.AuthenticationWrongNumberOfArgsError):
        return (
            f"Redis refused the credentials ({e}): check redis.username and the password "
            "that redis.password_env or redis.password_file points at"
        )
    if isinstance(e, redis.ResponseError) and str(e).startswith("NOAUTH"):
        return (
            f"Redis wants a password ({e}): set redis.password_env or redis.password_file "
            "(and redis.username for an ACL user)"
        )
    return None


def require_credentials(rc: RedisConfig) -> None:
    """One PING at a command's start: ConfigError with the fix when Redis refuses our
    credentials, ServiceError when it does not answer."""
    try:
        connect(rc).ping()
    except redis.RedisError as e:
        fix = refused_credentials(e)
        if fix:
            raise ConfigError(fix) from None
        raise ServiceError(f"Redis at {redact_url(rc.url)} does not answer: {e}") from None
