"""The cluster's reply to ``train``: one pass's progressive (``test``) and training metrics
(the main task's, and each further task's in ``tasks``), its checkpoint and its timings.

Built by the training step (``pass_steps.train_pass``), so a field it misses fails there;
it travels as JSON through Redis and Airflow's XCom; the quality gate reads it back with
``TrainResult.from_reply``, so a missing or renamed field fails at that boundary, naming
itself, instead of reading as "AUC is not finite".
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from streamrec.errors import ContractError, broken_fields
from trainers.checkpoints import CheckpointKind
from trainers.metrics import PassMetrics


class SaveSummary(BaseModel):
    """What a command's reply says of the save it made: its name, kind, path and keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: CheckpointKind
    path: str
    table_keys: int  # keys in the whole table after the save
    saved_keys: int  # keys this save wrote


class TaskResult(BaseModel):
    """A further task's metrics of the pass (the main task's are ``TrainResult``'s own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    test: PassMetrics  # progressive: its head before the pass, on the pass
    train: PassMetrics
    intercept: dict[str, Any] | None = None  # its refit (trainers.intercept)


class TrainResult(BaseModel):
    """What training one pass did and measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pass_id: str
    rows: int  # the pass manifest's
    count_matches_manifest: bool  # every row trained on, every sampled row scored
    test: PassMetrics  # progressive: the model before the pass, on the pass
    train: PassMetrics  # the training run's own predictions
    seconds: dict[str, float]  # per stage
    workers: int
    reader: str
    progressive: str
    progressive_every: int
    batch_size: int = 0  # rows per training batch of the pass (0: a result from before)
    sync_mode: str
    sync_rounds: dict[str, Any] | None  # sync mode's rounds (trainers.sync_mode)
    dense_average: dict[str, Any] | None  # the averaged iterates (trainers.dense_average)
    intercept: dict[str, Any] | None  # the main task's refit (trainers.intercept)
    tasks: dict[str, TaskResult] = {}  # label name -> a further task's (multi-task networks)
    started_at: float  # epoch seconds
    trained_at: float
    # the save that made the pass durable; absent in a reply for a pass trained before
    checkpoint: SaveSummary | None = None
    already_in_model: str | None = None  # a train sent again: the save that holds the pass
    already_done: bool = False  # the same command sent again: its stored result

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> TrainResult:
        """The result as the cluster replied it; ContractError naming what is wrong."""
        try:
            return cls.model_validate(reply)
        except ValidationError as e:
            raise ContractError(
                f"the cluster's train result for pass {reply.get('pass_id')} breaks its "
                f"contract (trainers.results.TrainResult): {broken_fields(e)}"
            ) from None

    def reply(self) -> dict[str, Any]:
        """As JSON-ready data (NaN metrics stay NaN, which Python's json writes); the
        markers of a reply to a command sent again only when set, as the control plane
        reads their presence."""
        return self.model_dump(exclude_defaults=True)
