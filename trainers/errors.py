"""Errors of the trainer stage.

TrainerError (StreamrecError)
├── ClusterUnavailable   no live workers, or the cluster did not start: start or restart it
├── CommandTimeout       a command did not finish in time: look at the worker logs
├── CommandFailed        the cluster ran the command and reported an error
├── SaveFailed           the servers' save wrote no tables: the previous save stands
└── DeviceUnsupported    the installed Paddle wheel cannot run the requested device
"""

from streamrec.errors import StreamrecError


class TrainerError(StreamrecError):
    """Root of the trainer stage's errors."""


class ClusterUnavailable(TrainerError):
    """No live workers answer."""


class CommandTimeout(TrainerError):
    """A command did not complete in time."""


class CommandFailed(TrainerError):
    """The cluster reported a failure for a command."""


class SaveFailed(TrainerError):
    """The servers' save of a checkpoint wrote no tables (Paddle only logs it)."""


class DeviceUnsupported(TrainerError):
    """The requested device needs a different Paddle wheel."""

    exit_code = 2
