"""The per-pass status record in Redis (``RedisKeys.pass_status``): one hash per pass,
a field per step that finished on it, each field one contract's JSON. Three stages write
it (the cluster: train, maintain, export, and matured when a later pass's training judged
it on its final labels; delivery: gate, delivered; the catch-up: caught_up, superseded),
all through ``record``; every reader gets a ``PassStatus``."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from redis import Redis
from redis.client import Pipeline

from streamrec.contracts.catch_up import CaughtUp, Superseded
from streamrec.contracts.delivery import Delivery, GateDecision
from streamrec.contracts.training import (
    ExportReply,
    MaintainReply,
    MaturedMetrics,
    TrainResult,
)
from streamrec.contracts.wire import Contract
from streamrec.errors import ContractError
from streamrec.redis_keys import RedisKeys


class PassField(StrEnum):
    """The fields of a pass's status, each a step that finished on the pass."""

    TRAIN = "train"  # the cluster trained it (TrainResult)
    MAINTAIN = "maintain"  # the day's end after it (MaintainReply)
    EXPORT = "export"  # the raw inference export after it (ExportReply)
    GATE = "gate"  # the quality gate's decision (GateDecision)
    DELIVERED = "delivered"  # its version serves (Delivery)
    CAUGHT_UP = "caught_up"  # another run's catch-up claimed it (CaughtUp)
    SUPERSEDED = "superseded"  # trained, never exported: a newer pass is (Superseded)
    MATURED = "matured"  # judged again on its final labels (MaturedMetrics)


CONTRACT: dict[PassField, type[Contract]] = {
    PassField.TRAIN: TrainResult,
    PassField.MAINTAIN: MaintainReply,
    PassField.EXPORT: ExportReply,
    PassField.GATE: GateDecision,
    PassField.DELIVERED: Delivery,
    PassField.CAUGHT_UP: CaughtUp,
    PassField.SUPERSEDED: Superseded,
    PassField.MATURED: MaturedMetrics,
}
_NAMES = frozenset(f.value for f in PassField)
log = logging.getLogger(__name__)


class PassStatus(Contract):
    """What has happened to one pass: a field per step, None until it finished."""

    pass_id: str
    train: TrainResult | None = None
    maintain: MaintainReply | None = None
    export: ExportReply | None = None
    gate: GateDecision | None = None
    delivered: Delivery | None = None
    caught_up: CaughtUp | None = None
    superseded: Superseded | None = None
    matured: MaturedMetrics | None = None

    @classmethod
    def from_hash(cls, pass_id: str, fields: Mapping[str, str]) -> PassStatus:
        """The status from its Redis hash; ContractError naming the pass, the field and
        what is wrong in it (an unknown field too)."""
        values: dict[str, Any] = {}
        for name, raw in fields.items():
            if name not in _NAMES:
                raise ContractError(f"pass {pass_id}'s status has an unknown field {name!r}")
            values[name] = CONTRACT[PassField(name)].from_wire(raw, f"pass {pass_id}'s {name}")
        return cls(pass_id=pass_id, **values)

    @property
    def trained(self) -> bool:
        return self.train is not None


def record(
    r: Redis | Pipeline, keys: RedisKeys, pass_id: str, field: PassField, value: Contract
) -> None:
    """Set ``field`` of the pass's status to ``value`` (its contract checked first); in a
    pipeline, as part of its transaction."""
    expected = CONTRACT[field]
    if not isinstance(value, expected):
        raise TypeError(f"pass status {field} holds {expected.__name__}, not {value!r}")
    r.hset(keys.pass_status(pass_id), field.value, value.to_json())


def read_status(r: Redis, keys: RedisKeys, pass_id: str) -> PassStatus:
    """The pass's status (every field None for a pass nothing has happened to)."""
    return PassStatus.from_hash(pass_id, r.hgetall(keys.pass_status(pass_id)))


def read_statuses(
    r: Redis, keys: RedisKeys, pass_ids: Iterable[str], tolerant: bool = False
) -> list[PassStatus]:
    """Several passes' statuses in one round trip, in the order given. ``tolerant``: an
    unreadable one is logged and read as nothing done (a display must not let one broken
    record hide every other pass); otherwise its ContractError is raised."""
    ids = list(pass_ids)
    pipe = r.pipeline(transaction=False)
    for pass_id in ids:
        pipe.hgetall(keys.pass_status(pass_id))
    statuses = []
    for pass_id, raw in zip(ids, pipe.execute(), strict=True):
        try:
            statuses.append(PassStatus.from_hash(pass_id, raw))
        except ContractError as e:
            if not tolerant:
                raise
            log.warning("pass %s: its status is not shown: %s", pass_id, e)
            statuses.append(PassStatus(pass_id=pass_id))
    return statuses
