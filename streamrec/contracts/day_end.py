"""What the end of a logical day did after its last pass (``ops.pass_sequence.day_end``):
the cluster's maintenance, then retention."""

from __future__ import annotations

from pydantic import Field

from streamrec.contracts.training import MaintainReply
from streamrec.contracts.wire import Contract


class RetentionRun(Contract):
    """Retention after a pass: run when the pass closes its day, with what it deleted
    (per kind of file or key)."""

    pass_id: str
    retention: bool
    counts: dict[str, int] = Field(default_factory=dict)


class DayEnd(Contract):
    """The maintenance and retention after a pass (each a no-op unless it closes its day)."""

    maintain: MaintainReply
    retention: RetentionRun
