"""When each label's rows are written, in event time after the impression (pure).

Every label has a delay ``d`` (``schema.labels[].emit``): ``at_once`` 0, ``after_wait`` its
``wait_seconds``, ``after_window`` the longest window of the ``after_window`` labels (they
share one row, as before policies existed). Labels of the same delay share an observed
row; the impression's own labels ride in the earliest one. With a label written before its
window closes ("delayed"), every impression is also written once more with its final labels
when its longest window has closed (the matured row), and each positive that came after its
label's observed row is written as a duplicate when it comes.

A row written at event time ``e`` belongs to the pass whose window holds ``e - cut_delay``
(``cut_delay``: the earliest delay), and a pass is cut once the watermark passes its end
plus ``cut_delay``: so an impression's earliest row lands in its own window's pass, every
row is written once the events it depends on are in (up to the allowed lateness), and which
pass a row lands in depends on event times only. Without a delayed label this is the one
row per impression of every label's longest window, in its window's pass, as ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from streamrec.config import (
    ELAPSED_COLUMN,
    LabelSpec,
    PipelineConfig,
    delay_column,
    kind_column,
    label_column,
)

AT_ONCE, AFTER_WAIT, AFTER_WINDOW = "at_once", "after_wait", "after_window"
Emit = Literal["after_window", "at_once", "after_wait"]


@dataclass(frozen=True)
class JoinedLabel:
    """What the join needs of a label joined from its own topic."""

    kind: str  # the label's name; also the kind of its topic
    column: str  # its pass column
    window_ms: int
    requires: str | None = None  # the name of the label a positive implies
    keep_unattributed: bool = False
    dead_letter_strays: bool = False
    emit: Emit = "after_window"
    wait_ms: int = 0  # emit: after_wait


@dataclass(frozen=True)
class EmitPlan:
    """Label delays and groups for one schema's labels."""

    columns: dict[str, str]  # every label's pass column by name, in the schema's order
    joined: tuple[str, ...]  # the labels joined from topics
    groups: tuple[
        tuple[int, tuple[str, ...]], ...
    ]  # (delay ms, labels of that row), earliest first
    mature_ms: int  # the longest label window: every label of an impression is final then
    delayed: bool  # some label is written before its window closes

    @property
    def cut_delay_ms(self) -> int:
        """How long after its window's end a pass is cut: the earliest row's delay."""
        return self.groups[0][0]

    @property
    def final_ms(self) -> int:
        """When an impression's last row is written: matured, or its one row."""
        return self.mature_ms if self.delayed else self.cut_delay_ms

    def delay_of(self, name: str) -> int:
        """The delay of the observed row that trains label ``name``."""
        return next(d for d, names in self.groups if name in names)

    def row_fields(self) -> list[pa.Field]:
        """The pass columns a delayed plan's rows add after the features, in order: each
        label's ``RowKind``, each joined label's delay as of the row, the row's elapsed
        time since its impression."""
        if not self.delayed:
            return []
        fields = [pa.field(kind_column(n), pa.int8(), nullable=False) for n in self.columns]
        fields += [pa.field(delay_column(n), pa.int64(), nullable=False) for n in self.joined]
        return [*fields, pa.field(ELAPSED_COLUMN, pa.int64(), nullable=False)]


def emit_plan(joined: Sequence[JoinedLabel], columns: dict[str, str]) -> EmitPlan:
    """The plan for the labels ``columns`` names (name -> pass column, schema order), of
    which ``joined`` come from topics and the rest with the impression."""
    shared_ms = max((x.window_ms for x in joined if x.emit == AFTER_WINDOW), default=0)

    def delay(label: JoinedLabel) -> int:
        if label.emit == AT_ONCE:
            return 0
        return label.wait_ms if label.emit == AFTER_WAIT else shared_ms

    delays = {x.kind: delay(x) for x in joined}
    earliest = min(delays.values(), default=0)
    for name in columns:
        delays.setdefault(name, earliest)  # carried: known with the impression
    groups = tuple(
        (d, tuple(name for name in columns if delays[name] == d))
        for d in sorted(set(delays.values()))
    ) or ((0, ()),)
    return EmitPlan(
        columns=dict(columns),
        joined=tuple(x.kind for x in joined),
        groups=groups,
        mature_ms=max((x.window_ms for x in joined), default=0),
        delayed=any(x.emit != AFTER_WINDOW for x in joined),
    )


def joined_labels(labels: Sequence[LabelSpec]) -> list[JoinedLabel]:
    """The join's view of the labels joined from topics (``labels``: the schema's)."""
    return [
        JoinedLabel(
            kind=label.name,
            column=label_column(i, label.name),
            window_ms=(label.window_seconds or 0) * 1000,
            requires=label.requires,
            keep_unattributed=label.unattributed == "keep",
            dead_letter_strays=label.strays == "dead_letter",
            emit=label.emit,
            wait_ms=(label.wait_seconds or 0) * 1000,
        )
        for i, label in enumerate(labels)
        if label.source == "topic"
    ]


def plan_of(cfg: PipelineConfig) -> EmitPlan:
    """The pipeline's emit plan."""
    columns = {label.name: label_column(i, label.name) for i, label in enumerate(cfg.labels)}
    return emit_plan(joined_labels(cfg.labels), columns)
