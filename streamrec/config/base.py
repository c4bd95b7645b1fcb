"""What every config section shares: strict, frozen models, and the names they reserve."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

EMBEDDED = "embedded"
RESERVED_COLUMNS = frozenset(
    {
        "event_id",
        "event_time_ms",
        "label",
        "kafka_partition",
        "kafka_offset",
        "served_version",
        "elapsed_ms",
    }
)
ELAPSED_COLUMN = "elapsed_ms"  # rows of labels written before their window closed: event
# time from the impression to the row's writing
SERVED_VERSION = "served_version"  # passes cut from the served log: the version that scored


def served_p_column(task: str) -> str:
    """The pass column of the probability the served version gave ``task`` (passes cut
    from the served log)."""
    return f"served_p_{task}"


def kind_column(label: str) -> str:
    """The pass column saying what a row is for label ``label`` (``streamrec.passes.RowKind``),
    in passes with a label written before its window closed."""
    return f"kind_{label}"


def delay_column(label: str) -> str:
    """The pass column of the time from the impression to label ``label``'s event as of the
    row (-1: none yet), in passes with a label written before its window closed."""
    return f"delay_ms_{label}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
