"""The model file (PaddleRec style): optimizer, sparse table, hyper-parameters, runner."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from streamrec.config.base import _Strict
from streamrec.network import IMPORT_PATH, SHIPPED

DEFAULT_SPARSE_TABLE = "SparseFeatFactors"  # the shared table: every slot no other one claims
TABLE_NAME = r"^[A-Za-z][A-Za-z0-9_]*$"  # a Paddle parameter name; no dots (strategy keys)


class OptimizerConfig(_Strict):
    class_: Literal["adam", "adagrad", "sgd"] = Field(alias="class", description="Dense optimizer.")
    learning_rate: float = Field(gt=0, description="Dense learning rate.")

    @field_validator("class_")
    @classmethod
    def _servers_can_apply_it(cls, v: str) -> str:
        if v == "adagrad":  # the cluster's processes exit at start, found on a real cluster
            raise ValueError(
                "Paddle 2.6.2's parameter servers apply dense updates with SGD or Adam only "
                '("The dense optimizer in PS is only supported SGD or Adam!"); use adam or '
                "sgd (sparse_table.rule sets the sparse table's own rule)"
            )
        return v


class SparseTableConfig(_Strict):
    rule: Literal["adagrad", "std_adagrad", "adam", "naive"] = Field(
        "adagrad", description="Sparse SGD rule on the servers (embed and embedx)."
    )
    learning_rate: float = Field(0.05, gt=0, description="Sparse learning rate.")
    initial_range: float = Field(
        0.01,
        ge=0,
        description="New keys' embedx values are drawn from U(-initial_range, "
        "initial_range) by an engine Paddle seeds from the clock (embed_w starts at 0); "
        "0 starts them at zero, the same in every run, but a ctr_dnn without dense "
        "features then learns nothing (docs/decisions/, 'A steady model').",
    )
    embedx_threshold: int = Field(
        0, ge=0, description="Shows before a key gets its embedx part (only 0, at once, runs)."
    )
    shard_num: int = Field(16, ge=1, description="Shards of the table (files per save).")
    nonclk_coeff: float = Field(
        0.1,
        gt=0,
        description="Score of a show without a click; with admission on, the chance that a "
        "new key shown once (and not clicked) enters the table.",
    )
    click_coeff: float = Field(1.0, gt=0, description="Score of a click.")
    show_click_decay_rate: float = Field(
        0.98, gt=0, le=1, description="Show and click counts are multiplied by it at each shrink."
    )
    delete_threshold: float = Field(
        0.0, ge=0, description="Shrink deletes keys whose decayed score is below this."
    )
    delete_after_unseen_days: int = Field(
        30, ge=1, description="Shrink deletes keys not seen for more logical days than this."
    )
    delta_threshold: float = Field(
        1e-4,
        gt=0,
        description="A key is in a delta checkpoint when its score grew by this since the last "
        "save; keep it at most nonclk_coeff so one show is enough.",
    )
    delta_keep_days: int = Field(
        16, ge=0, description="Keys unseen for more days than this are left out of deltas."
    )
    admission: bool = Field(
        False,
        description="Probabilistic admission of new keys: a push creates a key with "
        "probability equal to its show/click score (capped at 1).",
    )

    @field_validator("embedx_threshold")
    @classmethod
    def _saves_stay_readable(cls, v: int) -> int:
        if v > 0:  # found on a real cluster: the first save's key count failed to parse
            raise ValueError(
                f"embedx_threshold {v}: with a threshold the servers save keys below it "
                "without their embedx values, so a save's lines differ in width, which the "
                "checkpoint and export readers do not parse yet; use 0"
            )
        return v

    @model_validator(mode="after")
    def _deltas_hold_every_touched_key(self) -> SparseTableConfig:
        if self.delta_threshold > self.nonclk_coeff:
            raise ValueError(
                f"sparse_table.delta_threshold ({self.delta_threshold}) is above nonclk_coeff "
                f"({self.nonclk_coeff}): keys shown once would be missing from delta "
                "checkpoints; lower delta_threshold"
            )
        return self


class SlotTableConfig(SparseTableConfig):
    """A sparse table of its own for some slots: its width, rule, rates and admission."""

    dim: int = Field(ge=2, description="Embedding width pulled per key (1 embed_w + embedx_dim).")
    slots: list[str] = Field(
        min_length=1, description="The schema's sparse slots whose keys live in this table."
    )


class HyperParameters(_Strict):
    sparse_feature_dim: int = Field(
        9,
        ge=2,
        description="Embedding width pulled per key of the shared table (1 embed_w + embedx_dim).",
    )
    optimizer: OptimizerConfig = Field(description="The dense optimizer.")
    sparse_table: SparseTableConfig = Field(
        SparseTableConfig(),
        description="The shared sparse table: every slot no entry of sparse_tables names.",
    )
    sparse_tables: dict[str, SlotTableConfig] = Field(
        {},
        description="More sparse tables by name, each with its slots, width and settings "
        "(the servers hold each as a table of its own; streamrec/config/tables.py).",
    )

    @field_validator("sparse_tables")
    @classmethod
    def _tables_are_distinct(cls, v: dict[str, SlotTableConfig]) -> dict[str, SlotTableConfig]:
        for name in v:
            if not re.match(TABLE_NAME, name) or name == DEFAULT_SPARSE_TABLE:
                raise ValueError(
                    f"sparse table name {name!r}: use letters, digits and _ (starting with a "
                    f"letter), other than {DEFAULT_SPARSE_TABLE}"
                )
        claimed = [slot for table in v.values() for slot in table.slots]
        twice = sorted({s for s in claimed if claimed.count(s) > 1})
        if twice:
            raise ValueError(f"slots {twice} are in more than one sparse table; name each once")
        return v

    # every other key is the network's own, validated by its Params (streamrec.network)
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    @property
    def network_params(self) -> dict[str, Any]:
        """The keys of this block that belong to the network."""
        return dict(self.model_extra or {})


class RunnerConfig(_Strict):
    sync_mode: Literal["async", "sync", "geo"] = Field("async", description="PS update mode.")
    thread_num: int = Field(1, ge=1, description="Reader/trainer threads per worker.")
    batch_size: int = Field(
        512,
        ge=1,
        description="Rows per training batch per thread, at most: a worker's share of a "
        "pass smaller than batch_size * min_batches_per_pass trains in smaller batches.",
    )
    min_batch_size: int = Field(
        64,
        ge=1,
        description="Rows per training batch per thread, at least (unless batch_size is "
        "smaller): below it each batch's fixed work and its gradient push cost more than "
        "the steps buy.",
    )
    min_batches_per_pass: int = Field(
        32,
        ge=1,
        description="A worker's share of a pass is cut into at least this many training "
        "batches while they hold min_batch_size rows: a small pass keeps the dense steps it "
        "needs to learn, a large one trains in batch_size rows (docs/decisions/, 'A "
        "steady model').",
    )
    reader_type: Literal["QueueDataset", "InMemoryDataset"] = Field(
        "QueueDataset",
        description="QueueDataset streams each pass through the pipe reader; InMemoryDataset "
        "loads it into memory and shuffles it globally across workers first.",
    )
    progressive: Literal["separate", "sample", "in_train"] = Field(
        "sample",
        description="Where a pass's progressive metrics come from. separate: an inference "
        "run over the whole pass first, then the training run (two reads; the model exactly "
        "as the previous pass left it). sample: the same inference run on every k-th row "
        "only (about progressive_rows; the whole pass when it is smaller), then training on "
        "every row: the model as the previous pass left it, at the cost of about 1/k of a "
        "read, with the metrics' sampling error. in_train: one read, each batch scored in "
        "the training run just before its own update (what the model learns within the pass "
        "included: faster, but optimistic where a pass teaches the model much).",
    )
    progressive_rows: int = Field(
        50_000,
        ge=1000,
        description="progressive: sample: rows scored before training, about: every k-th "
        "row of a larger pass. AUC's standard error on n rows with a CTR p is about "
        "0.5/sqrt(n * p): 0.005 at 50,000 rows and p = 0.2.",
    )
    dense_average: Literal["pass", "none"] = Field(
        "pass",
        description="What the servers keep of the dense parameters after a pass. pass: "
        "the mean of the pass's iterates (steadier calibration from pass to pass), from the "
        "second pass of a fresh model on; none: the last iterate.",
    )
    intercept: Literal["refit", "keep"] = Field(
        "refit",
        description="After training on a pass: refit: an inference read of a sample of the "
        "pass (intercept_rows), then the logit's bias is shifted so the model's predicted "
        "clicks on it equal its actual clicks (in-sample COPC 1, as a logistic regression's "
        "intercept makes it; AUC is unchanged); keep: the bias as training left it.",
    )
    intercept_rows: int = Field(
        50_000,
        ge=1000,
        description="Rows the intercept refit scores, about: every k-th row of a larger "
        "pass (a pass of 200,000 rows: every 4th). The shift's standard error is about "
        "1/sqrt(rows * p * (1 - p)) in logits: 0.01 at 50,000 rows and a CTR near 0.3.",
    )

    @field_validator("sync_mode")
    @classmethod
    def _sync_mode_runs(cls, v: str) -> str:
        # found on a real cluster; docs/decisions/ has the traces
        if v == "geo":
            raise ValueError(
                "'geo' in Paddle 2.6.2 keeps a fixed-size embedding on every worker "
                "(GeoCommunicator rejects sparse_embedding's hashed 64-bit feature signs at "
                "init_worker), and with a fixed-size one its checkpoints omit the embedding "
                "table, so the cluster could not restart. Use 'async' or 'sync'"
            )
        return v

    @model_validator(mode="after")
    def _sync_rounds_need_one_thread(self) -> RunnerConfig:
        if self.sync_mode == "sync" and self.thread_num != 1:
            raise ValueError(
                f"runner.thread_num is {self.thread_num}, but sync mode ends every batch in "
                "a round all workers join, one batch at a time: set runner.thread_num: 1 "
                "(or sync_mode: async)"
            )
        return self


class ModelConfig(_Strict):
    model: str = Field(
        pattern=r"^[a-z][a-z0-9_-]*$",
        description="The model's name: its folder under paths.model_root and its registry.",
    )
    network: str | None = Field(
        None,
        description="The network, by import path 'module:Class' (the model API: "
        "streamrec/network.py), importable from PYTHONPATH or the folder streamrec starts "
        "in; or a shipped one: " + ", ".join(SHIPPED) + ". Default: the shipped network "
        "the model is named after.",
    )
    seed: int | None = Field(
        2012,
        ge=1,
        description="Seed of every random choice Paddle lets a job seed: the dense "
        "parameters' initial values (worker 0's, which it pushes to the servers) and the "
        "graph's random ops. null: a different draw each start. The servers' initial "
        "values of new sparse keys come from an engine Paddle seeds from the clock; "
        "sparse_table.initial_range 0 makes them zeros (docs/decisions/).",
    )
    runner: RunnerConfig = Field(RunnerConfig(), description="How workers read and train.")
    hyper_parameters: HyperParameters = Field(
        description="Embedding width, the dense optimizer and the sparse tables."
    )

    @field_validator("network")
    @classmethod
    def _is_an_import_path(cls, v: str | None) -> str | None:
        if v is not None and v not in SHIPPED and not re.match(IMPORT_PATH, v):
            raise ValueError(
                f"{v!r} is neither an import path 'package.module:Class' nor a shipped "
                f"network ({', '.join(SHIPPED)})"
            )
        return v

    @model_validator(mode="after")
    def _names_a_network(self) -> ModelConfig:
        if self.network is None and self.model not in SHIPPED:
            raise ValueError(
                f"model {self.model!r} is not a shipped network's name: set network: "
                "'package.module:Class' (streamrec/network.py) or one of " + ", ".join(SHIPPED)
            )
        return self

    @property
    def network_name(self) -> str:
        """The network as the YAML names it: an import path 'module:Class', or a shipped
        network's name (``trainers.network_loader.network_path`` resolves both)."""
        return self.network or self.model
