"""Typed pipeline configuration: one loader, unknown keys fail, errors name the file and key.

A pipeline file (``configs/pipeline.yaml``) holds the Kafka, Redis, pass, path, cluster,
gate and synthetic-stream settings. Its ``schema`` and ``model`` keys are either inline
mappings or paths (relative to the pipeline file) to ``configs/schema.yaml`` and a
PaddleRec-style model file (``runner`` / ``hyper_parameters``). Relative ``paths`` are
resolved against the pipeline file's directory, so a config means the same thing from any
working directory. ``dump_config`` writes a self-contained copy (everything inline, paths
absolute) that subprocesses such as the trainer cluster and Airflow tasks load.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from streamrec.errors import ConfigError
from streamrec.secrets import check_source, read_secret, redact_url

EMBEDDED = "embedded"
RESERVED_COLUMNS = frozenset(
    {"event_id", "event_time_ms", "label", "kafka_partition", "kafka_offset"}
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class KafkaConfig(_Strict):
    bootstrap_servers: str = Field(
        description="Comma-separated host:port list of the Kafka brokers, or 'embedded' to "
        "start a local broker on loopback (demo and tests)."
    )
    impressions_topic: str = Field("impressions", description="Topic of impression events.")
    partitions: int = Field(2, ge=1, description="Partitions created for the topic when missing.")
    consumer_group: str = Field(
        "streamrec-pass-builder", description="Consumer group of the pass builders."
    )
    max_message_bytes: int = Field(
        1_000_000, ge=1024, description="Events larger than this are rejected as malformed."
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="Consumer group session timeout: how long a dead builder "
        "holds its partitions before the group hands them to another.",
    )
    dlq_suffix: str = Field(
        ".dlq", description="Malformed events of topic T go to T + dlq_suffix, with the reason."
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How clients talk to the brokers (SASL_SSL in production)."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism, with a SASL_* security_protocol."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password_env: str | None = Field(
        None, description="Environment variable holding the SASL password."
    )
    sasl_password_file: Path | None = Field(
        None, description="Absolute path of a file holding the SASL password."
    )
    ssl_cafile: Path | None = Field(
        None, description="CA bundle that signed the brokers' certificates (SSL, SASL_SSL)."
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none",
        description="Codec of the batches our own producers write (streamrec produce, the "
        "dead-letter producer). The builder reads every codec whatever this says.",
    )
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        "read_committed",
        description="What the pass builder reads: 'read_committed' skips events of aborted "
        "transactions and stops at an open one (its window waits for it); "
        "'read_uncommitted' reads everything written, aborted transactions included.",
    )
    missing_event_time: Literal["dead_letter", "record_timestamp"] = Field(
        "dead_letter",
        description="An event (click) without 'event_time' ('click_time'): dead-lettered "
        "with reason missing_field, or timed by its Kafka record's timestamp.",
    )

    @model_validator(mode="after")
    def _credentials_complete(self) -> KafkaConfig:
        check_source("kafka.sasl_password", self.sasl_password_env, self.sasl_password_file)
        if self.security_protocol.startswith("SASL_") and not (
            self.sasl_username and (self.sasl_password_env or self.sasl_password_file)
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs kafka.sasl_username and "
                "kafka.sasl_password_env (or kafka.sasl_password_file)"
            )
        return self

    def sasl_password(self) -> str | None:
        """The SASL password, read from its environment variable or file."""
        return read_secret("kafka.sasl_password", self.sasl_password_env, self.sasl_password_file)


class JoinConfig(_Strict):
    mode: Literal["label_in_impression", "click_join"] = Field(
        "label_in_impression",
        description="Where labels come from: the impression's own 'label', or clicks joined "
        "from clicks_topic by event_id within label_window_seconds.",
    )
    clicks_topic: str = Field("clicks", description="Topic of click events (click_join mode).")
    label_window_seconds: int = Field(
        600, ge=1, description="A click counts if it comes this soon after its impression."
    )


class RedisConfig(_Strict):
    url: str = Field(
        description="redis:// (or rediss://) URL of the control-plane Redis, without a "
        "password, or 'embedded' to start a local redis-server on loopback."
    )
    username: str | None = Field(None, description="ACL user; default: Redis's 'default' user.")
    password_env: str | None = Field(
        None, description="Environment variable holding the Redis password."
    )
    password_file: Path | None = Field(
        None, description="Absolute path of a file holding the Redis password."
    )

    @field_validator("url")
    @classmethod
    def _no_password_in_url(cls, v: str) -> str:
        if urlsplit(v).password is not None:
            raise ValueError(
                f"{redact_url(v)} holds a password: remove it from the URL and set "
                "redis.password_env (or redis.password_file) instead, so it stays out of "
                "configs and logs"
            )
        return v

    @model_validator(mode="after")
    def _password_readable(self) -> RedisConfig:
        check_source("redis.password", self.password_env, self.password_file)
        return self

    def password(self) -> str | None:
        """The password, read from its environment variable or file."""
        return read_secret("redis.password", self.password_env, self.password_file)


class PassConfig(_Strict):
    pass_minutes: int = Field(description="Length of one event-time pass window, in minutes.")
    allowed_lateness_seconds: int = Field(
        60, ge=0, description="A window closes once the watermark is this far past its end."
    )
    idle_partition_seconds: float = Field(
        10,
        gt=0,
        description="A partition with no new events for this long stops holding "
        "the watermark back (so one quiet partition cannot stall every pass).",
    )
    max_future_seconds: int = Field(
        3600,
        ge=0,
        description="Events timed further than this past the wall clock are "
        "dead-lettered (reason future_time): one bad clock must not close every window.",
    )
    max_gap_passes: int = Field(
        144,
        ge=1,
        description="Empty windows between two windows with data are written as "
        "empty passes up to this many; a longer gap (an outlier timestamp) is skipped.",
    )
    parts_per_pass: int = Field(
        4, ge=1, description="Parquet parts per pass; each worker reads whole parts."
    )

    @field_validator("pass_minutes")
    @classmethod
    def _divides_a_day(cls, v: int) -> int:
        if v <= 0 or 1440 % v:
            raise ValueError("pass_minutes must be a positive divisor of 1440 (e.g. 5, 10, 60)")
        return v


class PathConfig(_Strict):
    data_root: Path = Field(description="Root of pass directories (<data_root>/passes/...).")
    checkpoint_root: Path = Field(description="Root of cluster checkpoints.")
    model_root: Path = Field(description="Root of versioned inference artifacts.")
    work_root: Path = Field(description="Scratch: raw exports, cluster logs, resolved configs.")


_DNS_NAME = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
)


class NodeConfig(_Strict):
    """One host of a cluster spread over several: what ``streamrec cluster`` runs there."""

    name: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        description="The node's name, as 'streamrec cluster --node NAME' takes it.",
    )
    address: str = Field(
        description="How the other hosts reach this one: an IPv4 address or a DNS name (a "
        "StatefulSet pod's stable name, a compose service); names are resolved when each "
        "generation starts, and its servers and workers listen at the address."
    )
    servers: list[int] = Field(
        default_factory=list, description="Ports of the parameter servers this host runs."
    )
    workers: list[int] = Field(
        default_factory=list, description="Ports of the trainer workers this host runs."
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        import ipaddress

        try:
            ipaddress.IPv4Address(v)
            return v
        except ValueError:
            pass
        if not _DNS_NAME.fullmatch(v):
            raise ValueError("must be an IPv4 address or a DNS name (lower case)")
        return v

    @field_validator("servers", "workers")
    @classmethod
    def _ports(cls, v: list[int]) -> list[int]:
        if any(not 0 < p < 65536 for p in v):
            raise ValueError("ports must be between 1 and 65535")
        return v


class ClusterConfig(_Strict):
    servers: int = Field(
        1, ge=1, description="Parameter servers (derived from cluster.nodes when it is set)."
    )
    workers: int = Field(
        2, ge=1, description="Trainer workers (derived from cluster.nodes when it is set)."
    )
    nodes: list[NodeConfig] = Field(
        default_factory=list,
        description="The hosts of a cluster spread over several, each running "
        "'streamrec cluster' (empty: one host, every member on loopback).",
    )
    rendezvous_port: int = Field(
        36001,
        gt=0,
        lt=65536,
        description="Port of the collectives' rendezvous (gloo's HTTP store), on the first "
        "server's host (cluster.nodes only).",
    )
    node_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="A node not heard from for this long is lost: the others stop their "
        "members and wait for it to start a new generation; a node that cannot reach Redis "
        "for this long stops its own members (cluster.nodes only).",
    )
    use_gpu: bool = Field(False, description="Train on GPU workers (needs paddlepaddle-gpu).")
    command_timeout_seconds: float = Field(
        900,
        gt=0,
        description="How long a caller waits for the cluster to finish one command. Keep it "
        "above the daily save of your table: about 6.4 s per million keys a server on a "
        "2-core host (bench/scale.py).",
    )
    start_timeout_seconds: float = Field(
        180, gt=0, description="How long the launcher waits for every worker's first heartbeat."
    )
    heartbeat_seconds: float = Field(2.0, gt=0, description="Worker heartbeat period.")
    redis_outage_seconds: float = Field(
        60.0,
        ge=0,
        description="How long workers keep retrying Redis when it goes away (a restart); "
        "past it they fail, and the cluster restarts from its checkpoints once Redis is back.",
    )
    stop_grace_seconds: float = Field(
        20.0,
        gt=0,
        description="On SIGTERM or Ctrl-C, how long idle workers get to leave cleanly before "
        "the cluster's processes are killed (keep it under the service manager's own grace).",
    )

    @model_validator(mode="before")
    @classmethod
    def _counts_from_nodes(cls, data: Any) -> Any:
        """With ``nodes``, the server and worker counts are theirs; a count given beside
        them must agree."""
        if not isinstance(data, dict) or not data.get("nodes"):
            return data
        nodes = [n if isinstance(n, dict) else n.model_dump() for n in data["nodes"]]
        counts = {k: sum(len(n.get(k) or []) for n in nodes) for k in ("servers", "workers")}
        if not all(counts.values()):
            raise ValueError("cluster.nodes must list at least one server and one worker")
        for key, count in counts.items():
            if key in data and data[key] != count:
                raise ValueError(
                    f"cluster.{key} is {data[key]} but cluster.nodes list {count}: "
                    f"remove cluster.{key} (the nodes decide it) or make them agree"
                )
        return {**data, **counts}

    @model_validator(mode="after")
    def _nodes_consistent(self) -> ClusterConfig:
        if not self.nodes:
            return self
        names = [n.name for n in self.nodes]
        addresses = [n.address for n in self.nodes]
        for what, values in (("name", names), ("address", addresses)):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(
                    f"two nodes share the {what} {twice[0]}: Paddle tells nodes apart by "
                    "address, so give each host one node entry"
                )
        for node in self.nodes:
            ports = node.servers + node.workers
            if len(set(ports)) != len(ports):
                raise ValueError(f"node {node.name}: a port is listed twice")
        first = self._first_server()
        for node in self.nodes:
            if node.address == first and self.rendezvous_port in node.servers + node.workers:
                raise ValueError(
                    f"cluster.rendezvous_port {self.rendezvous_port} is also a member's port "
                    f"on node {node.name}: choose another"
                )
        return self

    def _first_server(self) -> str:
        return next(n.address for n in self.nodes if n.servers)


class CheckpointConfig(_Strict):
    base_every_passes: int = Field(
        6, ge=1, description="A full (base) checkpoint every N passes; deltas in between."
    )
    keep_bases: int = Field(
        3, ge=1, description="Complete bases kept (with their deltas); older ones are deleted."
    )


class GateConfig(_Strict):
    min_auc: float = Field(0.6, ge=0, le=1, description="Lowest progressive AUC delivered.")
    max_auc_drop: float = Field(
        0.02, ge=0, description="Largest AUC drop allowed against the serving model's pass."
    )
    min_rows: int = Field(100, ge=1, description="Passes with fewer rows are not delivered.")


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


class SyntheticConfig(_Strict):
    seed: int = Field(7, description="Seed of the generating model and the event stream.")
    events_per_pass: int = Field(20000, ge=1, description="Impressions generated per pass.")
    cardinality: dict[str, int] = Field(
        default_factory=dict,
        description="Distinct values per sparse slot; slots not named get 1000.",
    )
    zipf_a: float = Field(1.2, gt=1, description="Zipf exponent of the slot value ids.")
    click_delay_seconds: float = Field(
        60, gt=0, description="Mean delay of a click after its impression (exponential)."
    )
    drift_at_pass: list[int] = Field(
        default_factory=list,
        description="Pass indexes (0 = first) at which the generating weights are redrawn.",
    )
    drift_fraction: float = Field(
        0.5, gt=0, le=1, description="Share of each slot's weights redrawn at a drift."
    )
    weight_scale: float = Field(0.8, gt=0, description="Std-dev of per-value logit weights.")
    bias: float = Field(-1.5, description="Logit bias of the generating model.")


class SparseSlot(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Slot name, a field of 'sparse'.")
    multi: bool = Field(False, description="The slot holds a list of values.")
    default: str = Field("", description="Value used when the event lacks the slot.")


class DenseFeature(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Feature name, a field of 'dense'.")
    default: float = Field(0.0, description="Value used when the event lacks the feature.")


class SchemaConfig(_Strict):
    version: int = Field(description="Schema version, written into every pass manifest.")
    sparse: list[SparseSlot] = Field(min_length=1, description="Sparse slots, in model order.")
    dense: list[DenseFeature] = Field(default_factory=list, description="Dense float features.")

    @model_validator(mode="after")
    def _unique_names(self) -> SchemaConfig:
        names = [s.name for s in self.sparse] + [d.name for d in self.dense]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"feature names must be unique, repeated: {dupes}")
        reserved = sorted(set(names) & RESERVED_COLUMNS)
        if reserved:
            raise ValueError(f"feature names {reserved} are reserved pass columns; rename them")
        return self


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
    initial_range: float = Field(0.01, gt=0, description="Uniform init range of new embeddings.")
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


class HyperParameters(_Strict):
    sparse_feature_dim: int = Field(
        9, ge=2, description="Embedding width pulled per key (1 embed_w + embedx_dim)."
    )
    fc_sizes: list[int] = Field([64, 32], min_length=1, description="Hidden layer widths.")
    optimizer: OptimizerConfig
    sparse_table: SparseTableConfig = SparseTableConfig()


class RunnerConfig(_Strict):
    sync_mode: Literal["async", "sync", "geo"] = Field("async", description="PS update mode.")
    thread_num: int = Field(1, ge=1, description="Reader/trainer threads per worker.")
    batch_size: int = Field(128, ge=1, description="Mini-batch size per thread.")
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
        # found on a real cluster; docs/DECISIONS.md has the traces
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
    model: Literal["ctr_dnn", "wide_deep", "deepfm"] = Field(
        description="Model name, a key of trainers.models.MODELS."
    )
    runner: RunnerConfig = RunnerConfig()
    hyper_parameters: HyperParameters


class PipelineConfig(_Strict):
    name: str = Field(
        pattern=r"^[a-z][a-z0-9_-]*$", description="Pipeline name; Redis keys live under it."
    )
    feature_schema: SchemaConfig = Field(alias="schema", description="Feature schema.")
    model: ModelConfig = Field(description="Model, runner and hyper-parameters.")
    kafka: KafkaConfig
    join: JoinConfig = JoinConfig()
    redis: RedisConfig
    passes: PassConfig
    paths: PathConfig
    cluster: ClusterConfig = ClusterConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()
    gate: GateConfig = GateConfig()
    synthetic: SyntheticConfig = SyntheticConfig()
    schedule: ScheduleConfig | None = Field(
        None, description="Airflow scheduling; required by dags/streamrec_pass.py."
    )
    retention: RetentionConfig = RetentionConfig()
    serving: ServingConfig = ServingConfig()

    @property
    def uses_embedded_services(self) -> bool:
        return EMBEDDED in (self.kafka.bootstrap_servers, self.redis.url)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: file not found") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _field_help(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The description of the field at ``loc``, for error messages."""
    current: Any = model
    info = None
    for part in loc:
        if isinstance(part, int) or not (
            isinstance(current, type) and issubclass(current, BaseModel)
        ):
            continue
        fields = {f.alias or n: f for n, f in current.model_fields.items()}
        info = fields.get(part)
        if info is None:
            return ""
        ann = info.annotation
        current = getattr(ann, "__args__", (ann,))[0] if hasattr(ann, "__origin__") else ann
    return (info.description or "") if info else ""


def _explain(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid configuration"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        help_ = _field_help(PipelineConfig, e["loc"])
        if e["type"] == "missing":
            lines.append(f"  missing key '{key}': add it. {help_}".rstrip())
        elif e["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}': remove it or fix its spelling.")
        else:
            given = e.get("input")
            given = redact_url(given) if isinstance(given, str) else given  # never echo one
            lines.append(f"  key '{key}': {e['msg']} (got {given!r}). {help_}".rstrip())
    return "\n".join(lines)


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _substitute_env(value: Any, path: Path, key: str = "") -> Any:
    """Replace ``${VAR}`` in string values by the environment's VAR (addresses that differ
    per deployment). Secrets have their own ``*_env`` / ``*_file`` keys instead: they are
    read when a client is built, so they never enter the resolved config."""
    if isinstance(value, dict):
        return {
            k: _substitute_env(v, path, f"{key}.{k}" if key else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_substitute_env(v, path, key) for v in value]
    if not isinstance(value, str):
        return value

    def lookup(m: re.Match[str]) -> str:
        if m.group(1) not in os.environ:
            raise ConfigError(
                f"{path}: key '{key}' refers to ${{{m.group(1)}}} but the environment has no "
                f"{m.group(1)}: export it (secrets come from the environment, not the YAML)"
            )
        return os.environ[m.group(1)]

    return _ENV_REF.sub(lookup, value)


def _inline(raw: dict[str, Any], key: str, base: Path) -> None:
    """Replace a path-valued ``key`` by the YAML mapping it names."""
    value = raw.get(key)
    if isinstance(value, str):
        raw[key] = _read_yaml((base / value).resolve())


def load_config(path: str | Path) -> PipelineConfig:
    """Load and validate a pipeline config; raise ConfigError naming the file and the key.
    String values may hold ``${VAR}``, replaced by the environment variable VAR."""
    path = Path(path).resolve()
    raw = _substitute_env(_read_yaml(path), path)
    _inline(raw, "schema", path.parent)
    _inline(raw, "model", path.parent)
    paths = raw.get("paths")
    if isinstance(paths, dict):
        raw["paths"] = {
            k: str((path.parent / v).resolve()) if isinstance(v, str) else v
            for k, v in paths.items()
        }
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_explain(path, e)) from None


def with_services(cfg: PipelineConfig, bootstrap_servers: str, redis_url: str) -> PipelineConfig:
    """A copy of ``cfg`` pointing at concrete Kafka and Redis addresses."""
    return cfg.model_copy(
        update={
            "kafka": cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap_servers}),
            "redis": cfg.redis.model_copy(update={"url": redis_url}),
        }
    )


def dump_config(cfg: PipelineConfig, path: str | Path) -> Path:
    """Write a self-contained copy of ``cfg`` (schema and model inline, absolute paths)."""
    from streamrec.atomic_fs import write_text_atomic

    data = cfg.model_dump(mode="json", by_alias=True)
    return write_text_atomic(Path(path), yaml.safe_dump(data, sort_keys=False))
