"""What every config section shares: strict, frozen models, and the names they reserve."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

EMBEDDED = "embedded"
RESERVED_COLUMNS = frozenset(
    {"event_id", "event_time_ms", "label", "kafka_partition", "kafka_offset", "served_version"}
)
SERVED_VERSION = "served_version"  # passes cut from the served log: the version that scored


def served_p_column(task: str) -> str:
    """The pass column of the probability the served version gave ``task`` (passes cut
    from the served log)."""
    return f"served_p_{task}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
