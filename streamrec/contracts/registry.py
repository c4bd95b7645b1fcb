"""What the model registry keeps in Redis beside the versions' manifests
(``serving_export.registry``): each switch of the serving pointer, the versions withdrawn
on their online metrics, those metrics, and each running service's note of itself."""

from __future__ import annotations

from streamrec.contracts.wire import Contract


class Switch(Contract):
    """One move of the serving pointer (the registry's history, newest first)."""

    version: str
    previous: str | None
    ts: float  # epoch seconds
    reason: str | None = None  # a move that withdrew a version: why


class Withdrawal(Contract):
    """A version withdrawn on its online metrics: never promoted again."""

    reason: str
    at: float  # epoch seconds


class OnlineMetrics(Contract):
    """A version's online metrics for one task over the windows it answered (None: no
    labelled events to measure on), as ``streamrec online`` last recorded them."""

    version: str
    task: str
    windows: tuple[str, ...]
    count: int
    auc: float | None
    logloss: float | None
    copc: float | None


class ReplicaNote(Contract):
    """What one running ``streamrec serve`` tells the registry of itself."""

    replica: str  # <host name>:<port>
    host: str
    version: str | None  # None until a version is loaded
    loaded_at: float | None  # epoch seconds of the last swap
    noted_at: float  # epoch seconds of this note
    logged: int | None = None  # served events logged to Kafka (None: no served log)
    unlogged: int | None = None  # ... and those that could not be
    held: str | None = None  # the predecessor answering serving.holdout_share, if any
    canary: str | None = None  # the candidate answering serving.canary_share, if any
