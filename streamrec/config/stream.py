"""What flows through the pipeline: the passes it cuts, the feature schema of an event,
and the synthetic stream of the demo and the tests."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from streamrec.config.base import RESERVED_COLUMNS, _Strict


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
