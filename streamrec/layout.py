"""Where every stage keeps its files: the one home of the on-disk layout.

    <data_root>/passes/<day>/<pass_id>/            the pass builder's passes
    <data_root>/slices/<day>/<pass_id>/p<N>/       its per-partition slices
    <data_root>/slices/<day>/<pass_id>/steps/p<N>/<K>/  a partition's steps of the open pass
    <data_root>/slices/_latest/p<N>.json           the newest slice of a partition (a hint)
    <data_root>/slices/_held/<topic>/p<N>.json     a partition an open transaction holds
    <checkpoint_root>/<save>/                      the cluster's saves
    <model_root>/<model>/<version>/                delivery's artifacts
    <work_root>/exports/<pass_id>-<command>/       the cluster's raw inference exports
    <work_root>/scores/<pass_id>-<command>/        the cluster's predictions (``score``)
    <work_root>/scores/<pass_id>-progressive/      its progressive scores, fresh labels
    <work_root>/cluster-logs/                      the launcher's and node agents' logs
    <work_root>/pass-text/worker-<rank>/           a worker's pass in MultiSlot text
    <work_root>/metric-dumps/worker-<rank>/<phase>/  a worker's dumped predictions
    <work_root>/join-spill/<group>/p<N>/           a builder's spilled waiting rows

``<day>`` is a pass's logical UTC day (``day_of``). Every stage and retention asks a
``Layout`` (``Layout.of(cfg.paths)``), so a folder is named once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

PROGRESSIVE = "progressive"  # the score runs a pass's progressive read keeps


class _Roots(Protocol):
    # read-only: a frozen config's fields are
    @property
    def data_root(self) -> Path: ...
    @property
    def checkpoint_root(self) -> Path: ...
    @property
    def model_root(self) -> Path: ...
    @property
    def work_root(self) -> Path: ...


def day_of(pass_id: str) -> str:
    """The logical (UTC) day of a pass, ``YYYYMMDD``: its folder, and what a daily save
    closes."""
    return pass_id[:8]


@dataclass(frozen=True)
class DataLayout:
    """The pass builder's folders under ``data_root``."""

    root: Path

    @property
    def passes(self) -> Path:
        return self.root / "passes"

    def pass_dir(self, pass_id: str) -> Path:
        return self.passes / day_of(pass_id) / pass_id

    @property
    def slices(self) -> Path:
        return self.root / "slices"

    def slices_of(self, pass_id: str) -> Path:
        """Every partition's slice of ``pass_id``."""
        return self.slices / day_of(pass_id) / pass_id

    def slice_dir(self, pass_id: str, partition: int) -> Path:
        return self.slices_of(pass_id) / f"p{partition}"

    def steps_of(self, pass_id: str) -> Path:
        """Every partition's steps of ``pass_id`` (``passes.step_seconds``)."""
        return self.slices_of(pass_id) / "steps"

    def steps_dir(self, pass_id: str, partition: int) -> Path:
        return self.steps_of(pass_id) / f"p{partition}"

    def step_dir(self, pass_id: str, partition: int, step: int) -> Path:
        return self.steps_dir(pass_id, partition) / f"{step:03d}"

    @property
    def latest_slices(self) -> Path:
        """The newest slice of each partition, a file each (a hint)."""
        return self.slices / "_latest"

    def latest_slice_index(self, partition: int) -> Path:
        return self.latest_slices / f"p{partition}.json"

    @property
    def holds(self) -> Path:
        """The builders' notes of partitions an open transaction holds, a folder a topic."""
        return self.slices / "_held"


@dataclass(frozen=True)
class Layout:
    """The folders under a pipeline's four roots (``paths``)."""

    data: DataLayout
    checkpoint_root: Path
    model_root: Path
    work_root: Path

    @classmethod
    def of(cls, paths: _Roots) -> Layout:
        return cls(
            DataLayout(Path(paths.data_root)),
            Path(paths.checkpoint_root),
            Path(paths.model_root),
            Path(paths.work_root),
        )

    def model_dir(self, model: str) -> Path:
        """Every version of ``model`` (a version's folder: ``serving_export.artifact``,
        which refuses a name that is not one plain folder)."""
        return self.model_root / model

    @property
    def exports(self) -> Path:
        return self.work_root / "exports"

    def export_dir(self, pass_id: str, command_id: str) -> Path:
        return self.exports / f"{pass_id}-{command_id}"

    @property
    def scores(self) -> Path:
        return self.work_root / "scores"

    def scores_dir(self, pass_id: str, command_id: str) -> Path:
        return self.scores / f"{pass_id}-{command_id}"

    def progressive_scores(self, pass_id: str) -> Path:
        """A pass's progressive scores per row, kept until it is judged on its final labels
        (labels written before their window closes)."""
        return self.scores_dir(pass_id, PROGRESSIVE)

    @property
    def cluster_logs(self) -> Path:
        return self.work_root / "cluster-logs"

    def pass_text(self, rank: int) -> Path:
        return self.work_root / "pass-text" / f"worker-{rank}"

    def join_spills(self, consumer_group: str) -> Path:
        """The folder of the consumer group's spill stores, one ``p<N>`` per partition."""
        return self.work_root / "join-spill" / consumer_group

    def join_spill(self, consumer_group: str, partition: int) -> Path:
        """Where the pass builder spills partition ``partition``'s waiting rows: local
        disk of the builder's host (``streaming.join_spill``)."""
        return self.join_spills(consumer_group) / f"p{partition}"

    def metric_dumps(self, rank: int, phase: str) -> Path:
        return self.work_root / "metric-dumps" / f"worker-{rank}" / phase
