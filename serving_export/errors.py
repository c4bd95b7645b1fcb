"""Errors of the serving-export stage.

ServingError (StreamrecError)
├── ExportInvalid        a raw export or artifact is incomplete or fails its checksums
├── RegistryConflict     a change the registry's state forbids (forgetting the serving version)
└── NothingServing       no version is registered as serving yet
"""

from streamrec.errors import StreamrecError


class ServingError(StreamrecError):
    """Root of the serving-export stage's errors."""


class ExportInvalid(ServingError):
    """A raw export or a packaged artifact breaks its contract."""


class RegistryConflict(ServingError):
    """A registry change its current state forbids."""


class NothingServing(ServingError):
    """The registry has no serving version."""
