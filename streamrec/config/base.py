"""What every config section shares: strict, frozen models, and the names they reserve."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

EMBEDDED = "embedded"
RESERVED_COLUMNS = frozenset(
    {"event_id", "event_time_ms", "label", "kafka_partition", "kafka_offset"}
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
