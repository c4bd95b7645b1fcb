"""From a trained pass to serving and operations: the quality gate, the serving
replicas, the Airflow schedule and retention."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from streamrec.config.base import _Strict
from streamrec.secrets import check_source, read_secret


class TaskGate(_Strict):
    """A further task's own bounds (a multi-task network's head, by label name, or a
    conditional task such as ``conversion|click``); unset ones are the main task's."""

    min_auc: float | None = Field(None, ge=0, le=1, description="Lowest progressive AUC.")
    max_auc_drop: float | None = Field(
        None, ge=0, description="Largest AUC drop against the serving model's, for this task."
    )


class GateConfig(_Strict):
    min_auc: float = Field(0.6, ge=0, le=1, description="Lowest progressive AUC delivered.")
    max_auc_drop: float = Field(
        0.02, ge=0, description="Largest AUC drop allowed against the serving model's pass."
    )
    min_rows: int = Field(100, ge=1, description="Passes with fewer rows are not delivered.")
    fresh_min_auc: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Labels written before their window closes: lowest progressive AUC on the "
        "labels trained with (fresh, biased); min_auc applies to the newest matured pass, "
        "and to the fresh AUC until a first pass has matured.",
    )
    fresh_max_auc_drop: float = Field(
        0.05,
        ge=0,
        description="Labels written before their window closes: largest drop of the fresh "
        "progressive AUC against the serving model's.",
    )
    tasks: dict[str, TaskGate] = Field(
        default_factory=dict,
        description="Bounds of further tasks by name. Every head of a multi-task network "
        "is judged (with the main task's bounds unless named here); a conditional task "
        "(<task>|<given>: p(conversion | click) on the clicked rows) only when named here.",
    )


class OnlineConfig(_Strict):
    """Online metrics of each served version on the traffic it answered, and the alarm that
    rolls a worse one back (``streamrec online``); they need passes cut from the served
    log (``passes.cut_from: served_log``)."""

    windows: int = Field(
        48, ge=1, description="Newest passes (windows) the online metrics and the alarm read."
    )
    rollback: bool = Field(
        False,
        description="Roll serving back to the version before it when the serving version's "
        "online AUC is below that version's by more than max_auc_drop, on the windows where "
        "both answered; the version is withdrawn (never promoted again) with the reason.",
    )
    min_events: int = Field(
        5000,
        ge=1,
        description="Labelled events each of the two versions must have answered in those "
        "windows before they are compared (AUC's sampling error shrinks as 1/sqrt of it).",
    )
    max_auc_drop: float = Field(
        0.01, ge=0, le=1, description="Largest online AUC drop against the version before."
    )
    task: str | None = Field(None, description="Task compared (default: the first label).")


class ServingConfig(_Strict):
    """The online predictor service (``streamrec serve``)."""

    host: str = Field("127.0.0.1", description="Address the service listens on.")
    port: int = Field(8500, ge=0, le=65535, description="Port of the service (0: any free one).")
    sparse_store: Literal["inprocess", "redis"] = Field(
        "inprocess",
        description="Where serving looks embeddings up: 'inprocess' (the table in the "
        "service's memory) or 'redis' (delivery writes each version's keys into redis.url).",
    )
    runtime: Literal["paddle", "onnx"] = Field(
        "paddle",
        description="What runs the dense program: 'paddle' (Paddle Inference) or 'onnx' "
        "(onnxruntime on the artifact's model.onnx).",
    )
    poll_seconds: float = Field(
        0.5, gt=0, description="How often the service reads the registry's serving pointer."
    )
    max_events: int = Field(1024, ge=1, description="Most events in one /predict request.")
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest /predict body accepted, in bytes."
    )
    threads: int = Field(
        1,
        ge=1,
        description="Math threads of one scoring call (Paddle Inference, or onnxruntime's "
        "intra-op threads). Calls run one at a time (on the service's event loop; on a "
        "thread of their own with the Redis store), each on every request waiting; more "
        "threads pay off for large batches only.",
    )
    max_in_flight: int = Field(
        256,
        ge=1,
        description="/predict requests admitted at once (being read, waiting for a "
        "predictor or scored); one more is answered 503 'overloaded' with Retry-After at "
        "once. Size it as the measured capacity (req/s) times the wait you accept (s).",
    )
    retry_after_seconds: int = Field(
        1, ge=1, description="The Retry-After of an 'overloaded' answer, in seconds."
    )
    shutdown_grace_seconds: float = Field(
        10,
        gt=0,
        description="How long 'streamrec serve' takes at most to stop after SIGTERM: it "
        "stops accepting at once, answers what is in flight for four fifths of it, refuses "
        "what still waits with 503 'shutting_down', and gives the served log the rest to "
        "write what it holds (what it cannot is counted). Keep Kubernetes' "
        "terminationGracePeriodSeconds above it.",
    )
    log_topic: str | None = Field(
        None,
        description="Kafka topic (on kafka.bootstrap_servers) where every event /predict "
        "answers is logged with the features it was scored on, the version and its scores "
        "(serving_export.served_log); an event without an event_id then gets one, returned. "
        "Unset: nothing is logged.",
    )
    log_buffer_events: int = Field(
        100_000,
        ge=1,
        le=2_147_483_647,  # librdkafka's bound of queue.buffering.max.messages
        description="Served records held while Kafka is slow or away (for at most a minute "
        "each); past it a record is dropped and counted unlogged (a request never waits for "
        "Kafka).",
    )
    holdout_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of events (by event id) the version that served before the "
        "current one keeps answering after a swap: online metrics then compare the two on "
        "the same windows and traffic (online.rollback). 0: every event gets the current.",
    )
    canary_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of requests (at random) a newly delivered version answers as a "
        "candidate before it serves: `streamrec online` promotes it once it answered "
        "online.min_events labelled events in the windows it shared with the serving "
        "version without an AUC below it by more than online.max_auc_drop, and withdraws it "
        "otherwise. 0: a delivered version serves at once.",
    )
    bearer_token_env: str | None = Field(
        None,
        description="Environment variable holding a token: /predict and /version then need "
        "'Authorization: Bearer <token>' (health, readiness and metrics stay open).",
    )
    bearer_token_file: Path | None = Field(
        None, description="Absolute path of a file holding that token (instead of the env)."
    )
    compact_ratio: float = Field(
        0.25,
        gt=0,
        description="In-process store: fold the keys changed since the last full version "
        "into the full table once they exceed this fraction of it.",
    )

    @model_validator(mode="after")
    def _token_readable(self) -> ServingConfig:
        check_source("serving.bearer_token", self.bearer_token_env, self.bearer_token_file)
        return self

    def bearer_token(self) -> str | None:
        """The token requests must carry, or None when the service is open."""
        return read_secret("serving.bearer_token", self.bearer_token_env, self.bearer_token_file)


class ScheduleConfig(_Strict):
    """How Airflow schedules the per-pass DAG (read by ``dags/`` only)."""

    start: datetime = Field(
        description="UTC time of the first pass window Airflow schedules (rounded down to a "
        "window boundary), e.g. '2026-11-23T08:00:00Z'. Every window from here on gets one "
        "run, in order, caught up after an outage; windows before the stream's first pass "
        "are skipped as soon as a later pass is complete. Set it to when your stream starts."
    )
    owner: str = Field(
        "streamrec",
        min_length=1,
        description="The DAG's owner as Airflow shows it: the team on call for this pipeline.",
    )
    wait_timeout_seconds: float = Field(
        86_400,
        gt=0,
        description="How long a run waits for its pass (a builder outage). Past it the run "
        "fails and later runs hold until it is cleared: passes are never skipped silently.",
    )
    poke_seconds: float = Field(
        5, gt=0, description="How often the pass sensor looks for the pass's _SUCCESS."
    )
    task_retries: int = Field(
        12,
        ge=0,
        description="Retries of each task (a cluster or Redis outage), with exponential "
        "backoff from retry_delay_seconds up to max_retry_delay_seconds.",
    )
    retry_delay_seconds: float = Field(10, gt=0, description="First retry delay.")
    max_retry_delay_seconds: float = Field(300, gt=0, description="Longest retry delay.")
    catchup_passes: int = Field(
        30,
        ge=0,
        description="While behind (after an outage), the most complete passes one run trains "
        "after its own, each with its gate decision and day-end maintenance; the run then "
        "exports and delivers only the newest, and the runs of the passes it trained skip. "
        "0 trains one pass per run.",
    )

    @field_validator("start")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("give a UTC time with its zone, e.g. '2026-11-23T08:00:00Z'")
        return v.astimezone(UTC)


class RetentionConfig(_Strict):
    """What ``streamrec retention`` (and the DAG after a day's last pass) deletes."""

    passes_days: float = Field(
        7,
        gt=0,
        description="Pass directories whose window ended longer ago than this are deleted "
        "once trained (an untrained pass is never deleted).",
    )
    slices_days: float = Field(
        1,
        gt=0,
        description="Slices of assembled passes older than this are deleted; each "
        "partition's newest slice (its resume point) is always kept.",
    )
    artifacts_keep: int = Field(
        10,
        ge=1,
        description="Newest model versions kept on disk and in the registry (for rollback); "
        "the serving version is always kept.",
    )
    redis_days: float = Field(
        30,
        gt=0,
        description="Per-pass status, done markers and command records of passes older than "
        "this are deleted, and the command stream is trimmed to the same age.",
    )
    leftover_minutes: float = Field(
        60,
        gt=0,
        description="A writer's temporary (a slice, pass, checkpoint save, export or "
        "artifact being written) is deleted at once when its writer ran on this host and is "
        "gone; any other once nothing in it changed for this long (by the writers when they "
        "start, and by retention). Keep it above the longest write: a base save of the whole "
        "table on shared storage.",
    )
    dead_letter_days: float = Field(
        14,
        gt=0,
        description="retention.ms of the dead-letter topics, set when the builder creates "
        "them: the broker drops dead letters (and so their counts) after this.",
    )

    @model_validator(mode="after")
    def _records_outlive_passes(self) -> RetentionConfig:
        if self.redis_days < self.passes_days:
            raise ValueError(
                f"retention.redis_days ({self.redis_days:g}) is below passes_days "
                f"({self.passes_days:g}): the Redis records that tell a pass was trained must "
                "outlive the pass; raise redis_days"
            )
        return self
