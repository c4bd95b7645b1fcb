"""A pass trained in steps before it is complete (``passes.step_seconds``), as one worker
holds it between commands.

The steps' scores and training go into the model as they come; what they measured waits
here, in the worker's memory, until the pass's ``train`` command trains the rest and
reports the whole. Nothing of it is durable: a cluster that restarts restores the save
before the pass and trains all of it again in its ``train`` command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainers.worker.pass_reads import TaskStats


def added(a: TaskStats | None, b: TaskStats | None) -> TaskStats | None:
    """Two reads' stats as one: buckets and sums added per task."""
    if a is None or b is None:
        return a if b is None else b
    return {
        task: (
            a[task][0] + b[task][0],
            a[task][1] + b[task][1],
            {n: a[task][2][n] + b[task][2][n] for n in a[task][2]},
        )
        for task in a
    }


@dataclass
class OpenPass:
    """What the steps of ``pass_id`` trained so far on this worker."""

    pass_id: str
    every: int  # the progressive sample's, the same for every read of the pass
    batch: int  # rows per training batch, the same for every read of the pass
    trained: set[str] = field(default_factory=set)  # pass part names (``pass_part``)
    tested: TaskStats | None = None
    train: TaskStats | None = None
    rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    # the newest step command's parts (path, rows): the pass's intercept refit reads them
    # with the rest of the pass, the freshest rows, however few the rest are
    newest: list[tuple[str, int]] = field(default_factory=list)

    def took(self, tested: TaskStats | None, train: TaskStats, seconds: dict[str, float]) -> None:
        """Add one step command's reads."""
        self.tested, self.train = added(self.tested, tested), added(self.train, train)
        for stage, s in seconds.items():
            self.seconds[stage] = round(self.seconds.get(stage, 0.0) + s, 3)
