"""Error root of streamrec and the errors of the shared core.

    StreamrecError                 every error we raise on purpose
    ├── ConfigError                the configuration is wrong: fix the named file and key
    ├── ServiceError               a local service (broker, redis-server) did not start or answer
    └── ContractError              a pass directory, manifest or artifact breaks its contract

Each stage package subclasses StreamrecError for its own errors; CLIs turn them into
a one-line message and a non-zero exit code.
"""

from pydantic import ValidationError


class StreamrecError(Exception):
    """Root of every error streamrec raises on purpose."""

    exit_code = 1


class ConfigError(StreamrecError):
    """The configuration is invalid; the message names the file, the key and the fix."""

    exit_code = 2


class ServiceError(StreamrecError):
    """A service could not be started or reached."""

    exit_code = 3


class ContractError(StreamrecError):
    """Data on disk or in Redis does not follow its documented contract."""

    exit_code = 4


def broken_fields(error: ValidationError) -> str:
    """A pydantic validation error in one line, each field by its dotted path:
    ``sparse.kind: Input should be 'full' or 'delta'; sign_version: Field required``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(the whole)'}: {e['msg']}" for e in error.errors()
    )
