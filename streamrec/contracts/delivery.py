"""What the delivery steps decide and do: the gate's decision on a pass and the delivery of
its version (``serving_export.delivery``), both kept on the pass's status."""

from __future__ import annotations

from pydantic import Field

from streamrec.contracts.wire import Contract


class GateDecision(Contract):
    """Whether to deliver the model trained through a pass, and why not."""

    passed: bool
    auc: float
    serving_auc: float | None
    reasons: tuple[str, ...] = ()
    task_aucs: dict[str, float] = Field(default_factory=dict)  # each further task judged
    # labels written before their window closed: ``auc`` and ``task_aucs`` are the newest
    # matured pass's (NaN before any), the progressive ones on the labels trained with
    # (biased) are the fresh ones
    matured_pass: str | None = None
    fresh_auc: float | None = None
    fresh_task_aucs: dict[str, float] = Field(default_factory=dict)


class TableLayer(Contract):
    """One sparse table's part of a layer: its keys and the embedding width."""

    keys: int
    dim: int


class LayerSummary(Contract):
    """A version's layer in the Redis sparse store (``sparse:<model>:layers``), set only
    once every table's hash of it is completely written."""

    kind: str  # full | delta (its artifact's)
    parent: str | None
    keys: int
    tables: dict[str, TableLayer]


class RedisPush(Contract):
    """The layers of a version's lineage written to the Redis sparse store."""

    version: str
    layers_written: tuple[str, ...]
    keys_written: int
    seconds: float


class Delivery(Contract):
    """A version handed to serving: made the serving one (``switched``; not when a newer
    one serves), or proposed as the canary candidate (``candidate``: whether it is)."""

    version: str
    previous: str | None
    switched: bool
    at: float  # epoch seconds
    redis: RedisPush | None = None  # with the Redis sparse store, written first
    candidate: bool | None = None  # with serving.canary_share: made the candidate
