"""The marks a run's catch-up (``ops.catchup``) leaves on the passes' status."""

from __future__ import annotations

from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.wire import Contract


class CaughtUp(Contract):
    """A pass another run's catch-up claimed (and then trained)."""

    by_run_of: str  # the pass whose run trained it
    at: float  # epoch seconds


class Superseded(Contract):
    """A pass trained and never exported: the newest pass of the same catch-up is."""

    by: str
    delivers: bool  # whether that newest pass passed the gate


class CatchUp(Contract):
    """What a run's catch-up did: the passes it trained after the run's own, oldest first,
    and the newest pass the model has now trained through, with its gate decision."""

    pass_id: str
    trained: tuple[str, ...]
    decision: GateDecision
