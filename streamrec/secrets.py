"""Secrets (the Redis password, Kafka's SASL password, the serving token) come from an
environment variable or a file named in the config, never from the YAML itself.

The config holds only where a secret is (``*_env`` or ``*_file``); it is read when a
client is built, so the resolved config that subprocesses load (``dump_config``) and every
log line hold the name of the variable or file, not the secret. Loading a config checks
only that a source is well formed; whether the variable or file is there is checked where
the secret is read, so each process needs only the secrets it uses (the DAG's tasks, for
one, never read the serving token), and one that uses a missing secret fails at its start
naming the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from streamrec.errors import ConfigError


def check_source(key: str, env: str | None, file: Path | None) -> None:
    """ValueError saying why the source of the secret ``key`` (``key + '_env'`` /
    ``key + '_file'``) is malformed; the config's validators call it at load."""
    if env and file:
        raise ValueError(f"give either {key}_env or {key}_file, not both")
    if file and not Path(file).is_absolute():
        raise ValueError(f"{key}_file {file} is relative: give an absolute path")


def read_secret(key: str, env: str | None, file: Path | None) -> str | None:
    """The secret from the environment variable ``env`` or the file ``file`` (trailing
    newline removed); None when neither is set; ConfigError naming ``key`` otherwise."""
    try:
        check_source(key, env, file)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if env and env not in os.environ:
        raise ConfigError(f"{key}_env names ${env}, which the environment does not have: export it")
    if file and not Path(file).is_file():
        raise ConfigError(f"{key}_file {file} does not exist or is not a file")
    if env:
        return os.environ[env]
    if file:
        try:
            value = Path(file).read_text().rstrip("\r\n")
        except OSError as e:
            raise ConfigError(f"{key}_file {file}: {e.strerror}") from None
        if not value:
            raise ConfigError(f"{key}_file {file} is empty")
        return value
    return None


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
