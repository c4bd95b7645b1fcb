"""Clients of the pipeline's Redis, built in one place from ``redis`` in the config: its
URL, ACL user and password (read from the environment or a file, ``streamrec.secrets``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from streamrec.config import RedisConfig
from streamrec.errors import ConfigError, ServiceError
from streamrec.secrets import redact_url

log = logging.getLogger(__name__)

# keys per SCAN round trip: redis-py's default of 10 made one pattern scan of a Redis that
# also holds a sparse store, or a long history, thousands of round trips (a worker's
# heartbeats: 1.5 s among 50,000 keys, 32 ms at 1,000; docs/decisions/)
SCAN_COUNT = 1000

# what the pipeline writes inside MULTI/EXEC (commands, done markers, registry switches)
TRANSACTION_WRITES = (
    ("HSET", "k", "f", "v"),
    ("SET", "k", "v"),
    ("XADD", "k", "*", "f", "v"),
    ("LPUSH", "k", "v"),
)


def connect(
    rc: RedisConfig, *, decode: bool = True, ride_out_s: float = 0.0, timeout_s: float = 30.0
) -> redis.Redis:
    """A client of ``rc``'s Redis returning str values (bytes with ``decode=False``).

    Without ``ride_out_s`` redis-py's default applies: three quick retries of a lost
    connection. With it, a command that meets a lost or refused connection is retried with
    backoff (up to 1 s) for about ``ride_out_s`` seconds (longer if Redis accepts but does
    not answer: each try may wait ``socket_timeout``), so a long-running process rides out a
    Redis restart instead of failing. Only for callers whose writes are idempotent: a
    retried write may have been applied once already. ``timeout_s`` bounds each connect
    and each reply."""
    extra = {}
    if ride_out_s > 0:
        extra["retry"] = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=int(ride_out_s) + 5)
    return redis.Redis.from_url(
        rc.url,
        username=rc.username,
        password=rc.password(),
        decode_responses=decode,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
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
    client = connect(rc)
    try:
        client.ping()
    except redis.RedisError as e:
        fix = refused_credentials(e)
        if fix:
            raise ConfigError(fix) from None
        raise ServiceError(f"Redis at {redact_url(rc.url)} does not answer: {e}") from None
    if aof_loses_transactions(client):
        log.warning(
            "Redis at %s keeps an append-only file and its default user has no permissions: "
            "a Redis without the fix of redis/redis#14545 (7.0 has not got it) replays "
            "MULTI/EXEC from that file as the default user, so a restart silently drops every "
            "transaction (done markers, registry switches). Keep the user off but give its "
            "permissions back: user default off ~* &* +@all",
            redact_url(rc.url),
        )


def aof_loses_transactions(client: redis.Redis) -> bool:
    """Whether this Redis's append-only file would lose the pipeline's transactions on a
    restart: it is on and the default user may not run ``TRANSACTION_WRITES``. False when
    our user may not ask (no CONFIG or ACL rights): there is nothing to warn about then."""
    try:
        if client.config_get("appendonly").get("appendonly") != "yes":
            return False
        dryrun = ("ACL", "DRYRUN", "default")
        replies = [client.execute_command(*dryrun, *c) for c in TRANSACTION_WRITES]
    except redis.ResponseError:
        return False
    return any(reply not in ("OK", b"OK") for reply in replies)


def scan_keys(client: redis.Redis, pattern: str) -> Iterator[Any]:
    """Every key matching ``pattern`` (str, or bytes from a client made with
    ``decode=False``), ``SCAN_COUNT`` keys a round trip: the one way the pipeline scans."""
    return client.scan_iter(match=pattern, count=SCAN_COUNT)
