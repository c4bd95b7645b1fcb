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
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from streamrec.config.base import EMBEDDED, _Strict
from streamrec.config.cluster import CheckpointConfig, ClusterConfig, PathConfig
from streamrec.config.delivery import (
    GateConfig,
    OnlineConfig,
    RetentionConfig,
    ScheduleConfig,
    ServingConfig,
)
from streamrec.config.model import ModelConfig
from streamrec.config.services import JoinConfig, KafkaConfig, RedisConfig
from streamrec.config.stream import LabelSpec, PassConfig, SchemaConfig, SyntheticConfig
from streamrec.config.tables import check_tables
from streamrec.errors import ConfigError
from streamrec.secrets import redact_url


class PipelineConfig(_Strict):
    name: str = Field(
        pattern=r"^[a-z][a-z0-9_-]*$", description="Pipeline name; Redis keys live under it."
    )
    feature_schema: SchemaConfig = Field(alias="schema", description="Feature schema.")
    model: ModelConfig = Field(description="Model, runner and hyper-parameters.")
    kafka: KafkaConfig = Field(description="The brokers, topics, consumer and producer.")
    join: JoinConfig = Field(
        JoinConfig(), description="Where the click comes from (older form of schema.labels)."
    )
    redis: RedisConfig = Field(description="The Redis of the registry and the cluster's commands.")
    passes: PassConfig = Field(description="The pass clock, lateness, and the pass builder.")
    paths: PathConfig = Field(description="The data, checkpoint, model and work roots.")
    cluster: ClusterConfig = Field(
        ClusterConfig(), description="The parameter-server cluster: members, hosts, modes."
    )
    checkpoints: CheckpointConfig = Field(
        CheckpointConfig(), description="Delta and base saves, what is kept, warm start."
    )
    gate: GateConfig = Field(GateConfig(), description="What a version must show to serve.")
    synthetic: SyntheticConfig = Field(
        SyntheticConfig(), description="The synthetic stream of the demo and the benchmarks."
    )
    schedule: ScheduleConfig | None = Field(
        None, description="Airflow scheduling; required by dags/streamrec_pass.py."
    )
    retention: RetentionConfig = Field(
        RetentionConfig(), description="How long passes, saves, versions and keys are kept."
    )
    serving: ServingConfig = Field(
        ServingConfig(), description="`streamrec serve`: its address, store, bounds, shares."
    )
    online: OnlineConfig = Field(
        OnlineConfig(), description="Online metrics of served versions; their rollback."
    )

    @model_validator(mode="after")
    def _labels_said_once(self) -> PipelineConfig:
        if self.join.mode == "click_join" and self.feature_schema.labels != [
            LabelSpec(name="click")
        ]:
            raise ValueError(
                "join.mode click_join and schema.labels both say where labels come from: "
                "list the click in schema.labels (source: topic, topic: "
                f"{self.join.clicks_topic}, window_seconds: {self.join.label_window_seconds}) "
                "and leave join out"
            )
        return self

    @model_validator(mode="after")
    def _steps_hold_final_rows(self) -> PipelineConfig:
        if self.passes.step_seconds is None:
            return self
        if self.topic_labels:
            raise ValueError(
                "passes.step_seconds writes rows as they are read, which a label joined "
                "from its own topic is not yet: carry the labels in the impressions "
                "(join.mode: label_in_impression) or set passes.step_seconds: null"
            )
        if self.passes.join_memory_mib is not None:
            raise ValueError(
                "passes.step_seconds holds at most a step of rows: set "
                "passes.join_memory_mib: null (no spill store)"
            )
        if not self.cluster.follow_passes:
            raise ValueError(
                "passes.step_seconds: steps are trained by the cluster's pass follower: set "
                "cluster.follow_passes: true, or passes.step_seconds: null"
            )
        return self

    @model_validator(mode="after")
    def _gated_tasks_are_labels(self) -> PipelineConfig:
        names = {label.name for label in self.feature_schema.labels}
        for task in self.gate.tasks:
            if not set(task.split("|")) <= names or task.count("|") > 1:
                raise ValueError(
                    f"gate.tasks.{task}: name a label of schema.labels {sorted(names)}, or a "
                    "conditional task <label>|<the label it requires>"
                )
        return self

    @model_validator(mode="after")
    def _served_impressions_carry_no_labels(self) -> PipelineConfig:
        log = self.serving.log_topic
        if self.passes.cut_from == "served_log" and log is None:
            raise ValueError(
                "passes.cut_from: served_log needs the served log: set serving.log_topic"
            )
        if self.passes.cut_from == "impressions" and self.kafka.impressions_topic == log:
            raise ValueError(
                f"kafka.impressions_topic is serving.log_topic ({log}): to cut the passes "
                "from what was served, set passes.cut_from: served_log and leave "
                "kafka.impressions_topic to the producers' topic"
            )
        carried = [x.name for x in self.labels if x.source == "impression"]
        if self.passes.cut_from == "served_log" and carried:
            raise ValueError(
                "passes.cut_from is served_log: passes are cut from what was served, which "
                f"carries no label; join {carried} from their own topics (join.mode: "
                "click_join, or schema.labels with source: topic)"
            )
        return self

    @model_validator(mode="after")
    def _online_reads_the_served_log(self) -> PipelineConfig:
        names = [label.name for label in self.labels]
        if self.online.task is not None and self.online.task not in names:
            raise ValueError(f"online.task: name a label of the pipeline ({names})")
        for key, on in (
            ("online.rollback", self.online.rollback),
            ("serving.canary_share", self.serving.canary_share > 0),
        ):
            if on and not self.served_tasks:
                raise ValueError(
                    f"{key} needs passes cut from the served log: set passes.cut_from: served_log"
                )
        if self.serving.canary_share + self.serving.holdout_share >= 1:
            raise ValueError(
                "serving.canary_share + serving.holdout_share must stay below 1: the "
                "serving version answers the rest"
            )
        return self

    @property
    def labels(self) -> list[LabelSpec]:
        """The labels each row carries: ``schema.labels``, or in ``click_join`` mode the
        click joined from ``join.clicks_topic`` (the same one column, ``label``)."""
        if self.join.mode != "click_join":
            return self.feature_schema.labels
        window = self.join.label_window_seconds
        return [
            LabelSpec(
                name="click", source="topic", topic=self.join.clicks_topic, window_seconds=window
            )
        ]

    @property
    def pass_topic(self) -> str:
        """The topic the passes are cut from (``passes.cut_from``)."""
        if self.passes.cut_from == "served_log" and self.serving.log_topic is not None:
            return self.serving.log_topic
        return self.kafka.impressions_topic

    @property
    def served_tasks(self) -> tuple[str, ...]:
        """Passes cut from the served log (``passes.cut_from: served_log``) keep, per row,
        the version that scored it and the probability it gave each of these tasks (every
        label); other passes: none."""
        if self.passes.cut_from != "served_log":
            return ()
        return tuple(label.name for label in self.labels)

    @property
    def topic_labels(self) -> list[LabelSpec]:
        """The labels joined from topics of their own."""
        return [label for label in self.labels if label.source == "topic"]

    @property
    def label_wait_seconds(self) -> int:
        """How long after its window a pass waits for its rows' labels: the longest window."""
        return max((label.window_seconds or 0 for label in self.topic_labels), default=0)

    @model_validator(mode="after")
    def _tables_fit_the_schema(self) -> PipelineConfig:
        check_tables(self.feature_schema, self.model)
        return self

    @model_validator(mode="after")
    def _interest_names_the_schema(self) -> PipelineConfig:
        interest = self.synthetic.interest
        if interest is not None:
            slots = {s.name: s for s in self.feature_schema.sparse}
            history, target = slots.get(interest.history), slots.get(interest.target)
            if history is None or history.pooling != "sequence":
                raise ValueError(
                    f"synthetic.interest.history {interest.history!r} must be a sparse slot "
                    "with pooling: sequence"
                )
            if target is None or target.multi:
                raise ValueError(
                    f"synthetic.interest.target {interest.target!r} must be a single-value "
                    "sparse slot"
                )
        return self

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
        if not e["loc"]:  # a rule across sections: its message names the keys
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "missing":
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
    checkpoints = raw.get("checkpoints")
    if isinstance(checkpoints, dict) and isinstance(checkpoints.get("warm_start"), str):
        checkpoints["warm_start"] = str((path.parent / checkpoints["warm_start"]).resolve())
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_explain(path, e)) from None


def _changed(current: Any, value: Any) -> Any:
    """``value`` over ``current``, as data to validate: a mapping over a section (a model)
    changes only the keys it names, sub-sections alike; anything else, a mapping over a
    mapping field included, replaces what was there."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if not (isinstance(value, dict) and isinstance(current, BaseModel)):
        return value
    data = current.model_dump(mode="json", by_alias=True)
    fields = type(current).model_fields
    for name, new in value.items():
        field = fields.get(name)
        key = field.alias if field is not None and field.alias else name
        data[key] = _changed(getattr(current, name, None), new)  # an unknown key fails below
    return data


def derived(cfg: PipelineConfig, what: str, **sections: Any) -> PipelineConfig:
    """``cfg`` with ``sections`` changed (a section's model replaces it; a mapping changes
    only the keys it names, in sub-sections too), validated as a loaded config is:
    pydantic's ``model_copy`` checks nothing, so a derived config would otherwise carry a
    value its file could not. ``what`` names it in the ConfigError."""
    data = _changed(cfg, sections)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(Path(what), e)) from None


def with_services(cfg: PipelineConfig, bootstrap_servers: str, redis_url: str) -> PipelineConfig:
    """A copy of ``cfg`` pointing at concrete Kafka and Redis addresses."""
    return derived(
        cfg,
        "the config on local services",
        kafka={"bootstrap_servers": bootstrap_servers},
        redis={"url": redis_url},
    )


def dump_config(cfg: PipelineConfig, path: str | Path) -> Path:
    """Write a self-contained copy of ``cfg`` (schema and model inline, absolute paths)."""
    from streamrec.atomic_fs import write_text_atomic

    data = cfg.model_dump(mode="json", by_alias=True)
    return write_text_atomic(Path(path), yaml.safe_dump(data, sort_keys=False))
