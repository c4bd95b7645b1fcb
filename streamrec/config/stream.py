"""What flows through the pipeline: the passes it cuts, the feature schema of an event,
and the synthetic stream of the demo and the tests."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from streamrec.config.base import RESERVED_COLUMNS, _Strict, delay_column, kind_column
from streamrec.passes import DAY_SECONDS, PassClock

MIN_PASS_SECONDS = 10  # below it a pass's fixed cost (reads, save, export) outgrows it


class PassConfig(_Strict):
    pass_seconds: int = Field(
        description="Length of one event-time pass window, in seconds: 10, 12, 15, 20 or 30, "
        "or whole minutes that divide a day (60, 300, 600, 3600...)."
    )
    cut_from: Literal["impressions", "served_log"] = Field(
        "impressions",
        description="What the passes are cut from: impressions, the producers' topic "
        "(kafka.impressions_topic); or served_log, what streamrec serve scored and logged "
        "(serving.log_topic), so a pass trains on exactly the features that were served "
        "and each row keeps the version and scores that answered it (closed loop).",
    )
    allowed_lateness_seconds: int = Field(
        60, ge=0, description="A window closes once the watermark is this far past its end."
    )
    idle_partition_seconds: float = Field(
        45,
        gt=0,
        description="A partition caught up with the broker and without new events for "
        "this long stops holding the watermark back (so one quiet partition cannot stall "
        "every pass). Keep it above the longest a producer may hold events back while a "
        "broker fails over: its request timeout (30 s by default) plus the brokers' "
        "session timeout (9 s); shorter, a broker lost mid-window makes events late "
        "(docs/decisions/, 'A broker lost').",
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
    join_memory_mib: int | None = Field(
        1024,
        ge=1,
        description="Memory a builder's waiting rows may take (each partition of the "
        "topic an equal share); past it a partition's rows spill to local disk under "
        "work_root/join-spill, checkpointed so that a restart resumes there instead of "
        "replaying the topics (a share of a few MiB spills at every poll). null holds every "
        "waiting row in memory.",
    )

    step_seconds: int | None = Field(
        None,
        ge=1,
        description="Publish each partition's rows of the open pass every this many seconds "
        "of event time (a step, final once written), so the cluster trains a pass while its "
        "window fills and only the last step is left at its end (cluster.follow_passes; "
        "labels carried in the impressions; join_memory_mib: null). Must divide "
        "pass_seconds. null: a pass is written once, at its end.",
    )

    @model_validator(mode="after")
    def _steps_divide_the_pass(self) -> PassConfig:
        step = self.step_seconds
        if step is not None and (step >= self.pass_seconds or self.pass_seconds % step):
            raise ValueError(
                f"passes.step_seconds {step} must divide passes.pass_seconds "
                f"({self.pass_seconds}) into two or more steps, e.g. "
                f"{self.pass_seconds // 4 or 1}; or null"
            )
        return self

    @field_validator("pass_seconds")
    @classmethod
    def _divides_a_day(cls, v: int) -> int:
        if v <= 0 or (60 % v if v < 60 else v % 60 or DAY_SECONDS % v) or v < MIN_PASS_SECONDS:
            raise ValueError(
                "passes.pass_seconds must be 10, 12, 15, 20 or 30, or whole minutes that "
                "divide a day (60, 300, 600, 3600...)"
            )
        return v

    @property
    def clock(self) -> PassClock:
        """The pass windows these settings cut."""
        return PassClock(self.pass_seconds)

    @property
    def steps_per_pass(self) -> int:
        """Steps a pass window is cut into (1: no steps)."""
        return self.pass_seconds // self.step_seconds if self.step_seconds else 1


class InterestConfig(_Strict):
    """A click history that matters (``streaming.synthetic``): each event has a few interest
    clusters (a value's id modulo ``clusters`` is its cluster), its ``history`` slot lists
    ``target`` values drawn mostly from them, its target is one of them a ``focus`` share
    of the time, and the logit gains ``weight`` when any history item shares the target's
    cluster. A network that matches the target against each item (attention) sees that;
    one that averages the history first sees it blurred."""

    history: str = Field(description="A sparse slot with pooling: sequence (the history).")
    target: str = Field(description="A single-value sparse slot whose values the history lists.")
    clusters: int = Field(32, ge=2, description="Interest clusters of the target's values.")
    interests: int = Field(3, ge=1, description="Interest clusters of one event.")
    weight: float = Field(3.0, description="Logit of a history item in the target's cluster.")
    focus: float = Field(
        0.8,
        ge=0,
        le=1,
        description="Share of history items, and of targets, from the event's interests.",
    )
    max_history: int = Field(10, ge=1, description="History lengths are uniform in 1..this.")


class ConversionConfig(_Strict):
    """A conversion process after the click (``streaming.synthetic``): a clicked impression
    converts with a known logistic probability of its own features, after a heavy-tailed
    (log-normal) delay: most within minutes, a tail of hours."""

    bias: float = Field(-1.0, description="Logit bias of p(conversion | click).")
    weight_scale: float = Field(
        0.8, gt=0, description="Std-dev of the per-value logit weights of p(conversion | click)."
    )
    delay_median_seconds: float = Field(
        600, gt=0, description="Median delay of a conversion after its click."
    )
    delay_sigma: float = Field(
        1.5, ge=0, description="Log-normal shape of the delay: 1.5 puts 5% past 12 medians."
    )


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
    drift_half_life_minutes: float | None = Field(
        None,
        gt=0,
        description="A stream that keeps drifting: every generating weight (clicks' and "
        "conversions') moves continuously in event time, its correlation with itself "
        "halving every this many minutes (an Ornstein-Uhlenbeck walk that keeps the "
        "weights' spread); the label delays stay as they are. None: no drift.",
    )
    weight_scale: float = Field(0.8, gt=0, description="Std-dev of per-value logit weights.")
    bias: float = Field(-1.5, description="Logit bias of the generating model.")
    interest: InterestConfig | None = Field(
        None, description="A click history the click depends on (streaming.synthetic)."
    )
    conversion: ConversionConfig | None = Field(
        None,
        description="A conversion process after the click, for a label named conversion "
        "(streaming.synthetic).",
    )


class SparseSlot(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Slot name, a field of 'sparse'.")
    multi: bool = Field(False, description="The slot holds a list of values.")
    default: str = Field("", description="Value used when the event lacks the slot.")
    pooling: Literal["sum", "mean", "sequence"] = Field(
        "sum",
        description="How a multi slot's keys reach the network: their embeddings summed or "
        "averaged, or (sequence) each key's embedding in order with a mask "
        "(streamrec.network.SequenceInput).",
    )
    max_length: int | None = Field(
        None, ge=1, le=1024, description="pooling: sequence: keys kept per row, at most."
    )
    keep: Literal["last", "first"] = Field(
        "last",
        description="pooling: sequence: which end of a longer list is kept (last: the newest, "
        "for a history listed oldest first).",
    )
    keys_of: str | None = Field(
        None,
        description="Hash this slot's values as the named slot's: the same value is the same "
        "key with one embedding (a click history listing item ids as item_id does).",
    )

    @property
    def key_slot(self) -> str:
        """The slot name a value's feature sign is hashed with."""
        return self.keys_of or self.name

    @model_validator(mode="after")
    def _pooling_fits(self) -> SparseSlot:
        if self.pooling != "sum" and not self.multi:
            raise ValueError(
                f"slot {self.name!r}: pooling {self.pooling} needs a list: set multi: true"
            )
        if (self.pooling == "sequence") != (self.max_length is not None):
            raise ValueError(
                f"slot {self.name!r}: max_length is for pooling: sequence, and required there"
            )
        return self


class DenseFeature(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Feature name, a field of 'dense'.")
    default: float = Field(0.0, description="Value used when the event lacks the feature.")


LABEL_NAME = r"^[a-z][a-z0-9_]*$"
# an impression's label object, {"click": 1, "conversion": 0}: any label it carries may be
# given there instead of in its own field
LABELS_OBJECT = "labels"
# the impression's fields that are not labels: no label may be read from one
EVENT_FIELDS = frozenset({"event_id", "event_time", "sparse", "dense", "served", LABELS_OBJECT})


def label_column(position: int, name: str) -> str:
    """The pass column of the label at ``position`` of the schema's list: ``label`` for the
    first (what trainers read as the main task's target), ``label_<name>`` for the others.
    What an impression names its labels is ``LabelSpec.event_fields``."""
    return "label" if position == 0 else f"label_{name}"


def default_label_field(name: str) -> str:
    """The impression field a label is read from unless ``field`` says otherwise:
    ``label_<name>``, and ``label`` for a label named click (as click pipelines always
    read it)."""
    return "label" if name == "click" else f"label_{name}"


class LabelSpec(_Strict):
    """One label the rows carry: a task's target, from the impression or its own topic."""

    name: str = Field(pattern=LABEL_NAME, description="The label's name (click, conversion).")
    source: Literal["impression", "topic"] = Field(
        "impression",
        description="impression: the impression carries it, in its field (see field) or "
        "in its label object ('labels': {<name>: 0 or 1}), exactly one of them; topic: "
        "events {event_id, <name>_time} on 'topic' label the impression with that "
        "event_id, if they come within window_seconds of it.",
    )
    field: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="source: impression: the impression's field holding it. Default: "
        "'label_<name>'; for a label named click 'label' (also 'label_click'). Never a "
        "field that names another label ('label' is click's, 'label_<x>' is x's) nor one "
        "of event_id, event_time, sparse, dense, served, labels.",
    )
    topic: str | None = Field(None, description="source: topic: the label events' topic.")
    window_seconds: int | None = Field(
        None,
        ge=1,
        description="source: topic: a label event counts if it comes this soon after its "
        "impression. Rows of after_window labels wait for the longest such window.",
    )
    requires: str | None = Field(
        None,
        description="source: topic: another label a positive of this one implies (a "
        "conversion implies its click). A positive whose row lacks it is unattributed.",
    )
    unattributed: Literal["dead_letter", "keep"] = Field(
        "dead_letter",
        description="An unattributed positive (see requires): dead_letter trains the row "
        "with this label 0 and sends the label event to the dead-letter topic (reason "
        "unattributed); keep trains it as a positive. Either way it is counted.",
    )
    emit: Literal["after_window", "at_once", "after_wait"] = Field(
        "after_window",
        description="source: topic: when a row is written for this label. after_window: "
        "once the window has closed, with the final label; at_once: at once as a negative, "
        "and a duplicate positive when the label comes (fake-negative weighting, FNW); "
        "after_wait: after wait_seconds with the label as of then, and a duplicate "
        "positive for a later one (ES-DFM weighting). The loss is corrected for the delay, "
        "and every row is written again, matured, once its windows have closed.",
    )
    wait_seconds: int | None = Field(
        None,
        ge=1,
        description="emit: after_wait: how long after its impression a row waits for this "
        "label; below window_seconds.",
    )
    loss_weights: Literal["by_emit", "none"] = Field(
        "by_emit",
        description="emit: at_once or after_wait: by_emit weights each row's loss so the "
        "model learns the true labels' probability (FNW for at_once, ES-DFM for "
        "after_wait); none trains the rows as written, biased towards the labels seen so "
        "far (to measure what the weights are worth).",
    )
    strays: Literal["count", "dead_letter"] = Field(
        "count",
        description="Label events that label no row: after their window (late), repeated "
        "(duplicate), or whose impression was never pending (unmatched). Always counted in "
        "the pass manifest; dead_letter also sends each to the dead-letter topic with its "
        "reason.",
    )

    @property
    def time_key(self) -> str:
        """The label event's field holding when it happened."""
        return f"{self.name}_time"

    @property
    def event_fields(self) -> tuple[str, ...]:
        """The impression's fields this label may be given in, the one our producers write
        first (``labels.<name>`` is read too)."""
        if self.field is not None:
            return (self.field,)
        if self.name == "click":
            return ("label", "label_click")
        return (default_label_field(self.name),)

    @field_validator("field")
    @classmethod
    def _field_names_no_other_label(cls, field: str | None, info: ValidationInfo) -> str | None:
        name = info.data.get("name")
        if field is None or name is None:
            return field
        if field in EVENT_FIELDS:
            raise ValueError(f"{field!r} is the impression's own field, not a label's")
        other = "click" if field == "label" else field.removeprefix("label_")
        if (field == "label" or field.startswith("label_")) and other != name:
            raise ValueError(
                f"label {name!r} may not be read from {field!r}, which names the label "
                f"{other!r}: leave field out (it reads {default_label_field(name)!r}) or "
                "name a field of your own"
            )
        return field

    @model_validator(mode="after")
    def _source_fits(self) -> LabelSpec:
        joined = self.source == "topic"
        if joined != (self.topic is not None) or joined != (self.window_seconds is not None):
            raise ValueError(
                f"label {self.name!r}: topic and window_seconds are for source: topic, and "
                "required there"
            )
        if self.field is not None and joined:
            raise ValueError(
                f"label {self.name!r}: field is for source: impression; a label event on "
                f"its topic is {{event_id, {self.time_key}}}"
            )
        if self.emit != "after_window" and not joined:
            raise ValueError(
                f"label {self.name!r}: emit {self.emit!r} is for source: topic; the "
                "impression carries its label at once"
            )
        if (self.emit == "after_wait") != (self.wait_seconds is not None):
            raise ValueError(
                f"label {self.name!r}: wait_seconds is for emit: after_wait, and required there"
            )
        if self.wait_seconds is not None and self.wait_seconds >= (self.window_seconds or 0):
            raise ValueError(
                f"label {self.name!r}: wait_seconds ({self.wait_seconds}) must be below "
                f"window_seconds ({self.window_seconds}); to wait for the whole window use "
                "emit: after_window"
            )
        if self.requires is not None and not joined:
            raise ValueError(
                f"label {self.name!r}: requires is checked when a label event joins; an "
                "impression that carries both labels is trained as it says: drop requires"
            )
        return self


class SchemaConfig(_Strict):
    version: int = Field(description="Schema version, written into every pass manifest.")
    sparse: list[SparseSlot] = Field(min_length=1, description="Sparse slots, in model order.")
    dense: list[DenseFeature] = Field(default_factory=list, description="Dense float features.")
    labels: list[LabelSpec] = Field(
        default_factory=lambda: [LabelSpec(name="click")],
        min_length=1,
        description="The labels each row carries, the first one the main task's (in "
        "click_join mode, join's clicks; then leave this out).",
    )

    @property
    def label_columns(self) -> list[str]:
        """Each label's pass column, in the list's order."""
        return [label_column(i, label.name) for i, label in enumerate(self.labels)]

    @property
    def fresh_labels(self) -> list[LabelSpec]:
        """The labels written before their window closes (``emit`` not after_window): their
        rows carry what each row is for each label, and the loss is corrected for it."""
        return [label for label in self.labels if label.emit != "after_window"]

    @property
    def row_columns(self) -> list[str]:
        """The pass columns the trainer reads beside the labels: with a fresh label, each
        label's row kind, then each after_wait label's delay (its delay models' target)."""
        if not self.fresh_labels:
            return []
        kinds = [kind_column(label.name) for label in self.labels]
        waited = [delay_column(x.name) for x in self.labels if x.emit == "after_wait"]
        return kinds + waited

    @property
    def label_fields(self) -> frozenset[str]:
        """Every impression field a label of the schema may be given in, the label object
        included."""
        return frozenset({LABELS_OBJECT}.union(*(x.event_fields for x in self.labels)))

    @model_validator(mode="after")
    def _labels_are_sound(self) -> SchemaConfig:
        names = [label.name for label in self.labels]
        if len(set(names)) != len(names) or "impressions" in names:
            raise ValueError(f"label names must be unique and not 'impressions': {names}")
        fields = [f for label in self.labels for f in label.event_fields]
        if repeated := sorted({f for f in fields if fields.count(f) > 1}):
            raise ValueError(f"two labels are read from the same impression field: {repeated}")
        topics = [label.topic for label in self.labels if label.topic is not None]
        if len(set(topics)) != len(topics):
            raise ValueError(f"each joined label needs a topic of its own: {topics}")
        for label in self.labels:
            if label.requires is not None and label.requires not in set(names) - {label.name}:
                raise ValueError(
                    f"label {label.name!r}: requires {label.requires!r} must name another label"
                )
        features = {s.name for s in self.sparse} | {d.name for d in self.dense}
        if clash := sorted(features & (set(self.label_columns) - RESERVED_COLUMNS)):
            raise ValueError(f"feature names {clash} are label columns; rename them")
        delayed = {f(name) for name in names for f in (kind_column, delay_column)}
        if clash := sorted(features & delayed):
            raise ValueError(f"feature names {clash} are the labels' row columns; rename them")
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> SchemaConfig:
        names = [s.name for s in self.sparse] + [d.name for d in self.dense]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"feature names must be unique, repeated: {dupes}")
        slots = {s.name for s in self.sparse}
        for s in self.sparse:
            if s.keys_of is not None and (s.keys_of not in slots or s.keys_of == s.name):
                raise ValueError(
                    f"slot {s.name!r}: keys_of {s.keys_of!r} must name another sparse slot"
                )
        reserved = sorted(set(names) & RESERVED_COLUMNS)
        if reserved:
            raise ValueError(f"feature names {reserved} are reserved pass columns; rename them")
        return self
