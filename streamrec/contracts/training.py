"""What the cluster replies to ``train``, ``maintain`` and ``export``.

Built by the cluster's steps (``trainers.worker.pass_steps``, ``trainers.worker.saves``,
``trainers.worker.exports``), so a field they miss fails there; they travel as JSON through Redis
(the control plane, the pass status) and Airflow's XCom, and are read back with
``from_wire``. A reply to a command sent again carries the stored reply with
``already_done`` (and ``already_in_model``, the save that holds it, when the marker was
lost in a crash and the restored model answered).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Literal

from pydantic import Field

from streamrec.contracts.wire import Contract

CheckpointKind = Literal["base", "delta", "daily"]


@dataclass(frozen=True)
class PassMetrics:
    """Metrics of one evaluation over a pass (global across workers). A dataclass: the
    metrics maths builds it positionally; as a contract's field pydantic checks it."""

    count: int
    auc: float
    logloss: float
    copc: float  # actual clicks / predicted clicks: 1.0 is calibrated
    mae: float
    rmse: float
    actual_ctr: float
    predicted_ctr: float
    bucket_error: float  # calibration error within score ranges: 0.0 is calibrated

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class ReaderType(StrEnum):
    """How the workers read a pass (``model.runner.reader_type``)."""

    QUEUE = "QueueDataset"
    IN_MEMORY = "InMemoryDataset"


class Progressive(StrEnum):
    """How the pass was scored before training (``model.runner.progressive``)."""

    SEPARATE = "separate"
    SAMPLE = "sample"
    IN_TRAIN = "in_train"


class SyncMode(StrEnum):
    """The parameter servers' update mode (``model.runner.sync_mode``)."""

    ASYNC = "async"
    SYNC = "sync"


class Repeat(Contract):
    """The markers of a reply to a command sent again."""

    already_done: bool = False  # the same command sent again: its stored reply
    already_in_model: str | None = None  # the save that holds it (its marker lost)


class SaveSummary(Contract):
    """What a reply says of the save it made: its name, kind, path and keys."""

    name: str
    kind: CheckpointKind
    path: str
    table_keys: int  # keys in the whole table after the save
    saved_keys: int  # keys this save wrote


class SyncRounds(Contract):
    """Sync mode's rounds in the pass (``trainers.worker.sync_mode``): with a batch and idle."""

    rounds: int
    batches: int
    idle: int
    dense_digest: str


class DenseAverage(Contract):
    """The dense iterates averaged over the pass (``trainers.worker.dense_average``)."""

    batches: int
    dense_digest: str


class InterceptRefit(Contract):
    """One head's logit-bias refit (``trainers.worker.intercept``): the rows scored (every
    ``every``-th), their COPC before, and the shift added to the bias."""

    rows: int
    every: int
    copc_before: float
    shift: float


class TaskResult(Contract):
    """A further task's metrics of the pass (the main task's are ``TrainResult``'s own)."""

    test: PassMetrics  # progressive: its head before the pass, on the pass
    train: PassMetrics
    intercept: InterceptRefit | None = None


class MaturedMetrics(Contract):
    """A pass trained before its labels were final, judged again once they were: each
    task's metrics on its observed rows' final labels (its progressive scores, the labels
    its windows closed on)."""

    pass_id: str  # the pass judged
    judged_in: str  # the pass whose training judged it: its impressions matured by then
    tasks: dict[str, PassMetrics]  # label name -> its metrics, the main task first


class TrainResult(Repeat):
    """What training one pass did and measured."""

    pass_id: str
    rows: int  # the pass manifest's
    count_matches_manifest: bool  # every row trained on, every sampled row scored
    test: PassMetrics  # progressive: the model before the pass, on the pass
    train: PassMetrics  # the training run's own predictions
    seconds: dict[str, float]  # per stage
    workers: int
    reader: ReaderType
    progressive: Progressive
    progressive_every: int
    batch_size: int = 0  # rows per training batch of the pass (0: a result from before)
    sync_mode: SyncMode
    sync_rounds: SyncRounds | None
    dense_average: DenseAverage | None
    intercept: InterceptRefit | None  # the main task's refit
    tasks: dict[str, TaskResult] = Field(
        default_factory=dict
    )  # label name -> a further task's (multi-task networks)
    # the passes this one's matured rows finished judging (a schema with fresh labels)
    matured: list[MaturedMetrics] = Field(default_factory=list)
    started_at: float  # epoch seconds
    trained_at: float
    # the save that made the pass durable; absent in a reply for a pass trained before
    checkpoint: SaveSummary | None = None
    # rows trained by the pass's steps before it was complete (passes.step_seconds); the
    # rest, ``rows`` less these, by the pass's own command; the steps' seconds per stage
    rows_in_steps: int = 0
    seconds_in_steps: dict[str, float] = Field(default_factory=dict)


class MaintainReply(Repeat):
    """The day's end after its last pass: the shrink and the daily save (``maintenance``
    False: the pass does not close its day, nothing was done). A reply the restored model
    gave (``already_in_model``) has only the pass."""

    pass_id: str
    maintenance: bool = True
    day: str | None = None
    keys_before: int | None = None
    checkpoint: SaveSummary | None = None
    seconds: dict[str, float] = Field(default_factory=dict)


class StepsReply(Contract):
    """The steps of an open pass one ``train_steps`` command trained (``passes.step_seconds``):
    scored, then trained, not saved; the pass's ``train`` command trains the rest of it."""

    pass_id: str
    steps: list[str]  # "<partition>/<step>" trained now (those trained before are skipped)
    rows: int
    seconds: dict[str, float] = Field(default_factory=dict)


class ScoreReply(Contract):
    """One worker's predictions for its files of a pass (``score``): a Parquet file of
    event ids and a probability per task (``p_click``, ``p_<label>``)."""

    pass_id: str
    rank: int
    rows: int
    predictions: str  # the file


class ExportReply(Repeat):
    """The raw inference export after a pass: where it is and how long each stage took."""

    pass_id: str
    raw_export: str
    seconds: dict[str, float] = Field(default_factory=dict)
