"""Write partition slices and assemble passes from them (the layout is in streamrec.passes).

``write_step`` publishes a partition's rows of the open window read so far (a step,
``passes.step_seconds``: final, so the cluster may train it before the window ends);
``write_slice`` publishes one partition's share of a window, its steps linked in; if the
slice already exists (another builder, or an earlier life of this one, wrote it first) it
raises SliceTaken and the caller rebuilds that partition's state from the existing slice.
``assemble_pass`` turns a window whose every partition has a slice (or has cut past it)
into the pass directory, by hard links; any builder may call it, and a lost rename race
simply returns the winner's manifest.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from streaming.errors import StreamingError
from streamrec.atomic_fs import publish_dir, sha256_file, temp_dir_for, write_text_atomic
from streamrec.layout import DataLayout, day_of
from streamrec.listing import Listing, list_folder
from streamrec.passes import (
    PASS_MANIFEST_NAME,
    SLICE_MANIFEST_NAME,
    STEP_MANIFEST_NAME,
    SUCCESS_NAME,
    EventCounts,
    PartInfo,
    PartitionRange,
    PassClock,
    PassManifest,
    SliceManifest,
    StepManifest,
    by_day,
    is_complete,
    is_partition_name,
    is_pass_id,
    latest_slice_index,
    manifest_json,
    pass_dir,
    pass_listing,
    pass_part,
    read_manifest,
    read_slice,
    read_step,
    slice_dir,
    slice_step_part,
    slices_root,
    step_dir,
)

log = logging.getLogger(__name__)
MATURED_PART = "matured-00000.parquet"


class SliceTaken(StreamingError):
    """The slice (or step) was already published by someone else; carries its manifest."""

    def __init__(self, existing: SliceManifest | StepManifest) -> None:
        step = f" step {existing.step}" if isinstance(existing, StepManifest) else ""
        super().__init__(f"slice {existing.pass_id}/p{existing.partition}{step} already exists")
        self.existing = existing


def _publish(tmp: Path, final: Path, manifest_name: str, manifest: BaseModel) -> bool:
    """Write the manifest and the donefile into ``tmp`` and rename it to ``final``. False when
    another writer published ``final`` first (``tmp`` is then removed); any other failure of
    the rename (a read-only or broken file system) is raised as it is."""
    (tmp / manifest_name).write_text(manifest_json(manifest))
    (tmp / SUCCESS_NAME).touch()
    try:
        publish_dir(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_complete(final):  # the rename lost to a complete slice: someone else's
            return False
        raise
    return True


def parts_per_slice(parts_per_pass: int, partitions: int) -> int:
    """Parts each partition writes so that a pass has about ``parts_per_pass`` parts."""
    return max(1, math.ceil(parts_per_pass / partitions))


def _write_parts(table: pa.Table, n_parts: int, folder: Path) -> list[PartInfo]:
    n_parts = min(n_parts, table.num_rows)
    parts = []
    for i in range(n_parts):
        a, b = i * table.num_rows // n_parts, (i + 1) * table.num_rows // n_parts
        name = f"part-{i:05d}.parquet"
        pq.write_table(table.slice(a, b - a), folder / name)
        parts.append(PartInfo(file=name, rows=b - a, sha256=sha256_file(folder / name)))
    return parts


def _positives(table: pa.Table) -> int:
    return int(pc.sum(table["label"]).as_py() or 0) if table.num_rows else 0


def write_step(
    data_root: Path,
    schema_version: int,
    pass_id: str,
    partition: int,
    step: int,
    table: pa.Table,
    n_parts: int,
    fields: dict[str, Any],
) -> StepManifest:
    """Publish ``table`` as step ``step`` of ``partition``'s rows of ``pass_id``."""
    final = step_dir(data_root, pass_id, partition, step)
    if is_complete(final):
        raise SliceTaken(read_step(final))
    tmp = temp_dir_for(final)
    manifest = StepManifest(
        schema_version=schema_version,
        pass_id=pass_id,
        partition=partition,
        step=step,
        rows=table.num_rows,
        positives=_positives(table),
        parts=_write_parts(table, n_parts, tmp),
        created_at=datetime.now(UTC).isoformat(),
        **fields,
    )
    if not _publish(tmp, final, STEP_MANIFEST_NAME, manifest):
        raise SliceTaken(read_step(final))
    return manifest


def _merged(ranges: list[PartitionRange]) -> PartitionRange:
    return PartitionRange(
        first=min(r.first for r in ranges),
        last=max(r.last for r in ranges),
        rows=sum(r.rows for r in ranges),
    )


def write_slice(
    data_root: Path,
    schema_version: int,
    pass_id: str,
    partition: int,
    table: pa.Table,
    n_parts: int,
    fields: dict[str, Any],
    matured: pa.Table | None = None,
    steps: tuple[StepManifest, ...] = (),
) -> SliceManifest:
    """Publish ``table`` (and the ``matured`` rows, if any) as the slice of ``partition`` for
    ``pass_id``, with the parts, rows and counts of its published ``steps`` of the window."""
    final = slice_dir(data_root, pass_id, partition)
    if is_complete(final):
        raise SliceTaken(read_slice(final))
    tmp = temp_dir_for(final)
    parts = []
    for step in steps:
        folder = step_dir(data_root, pass_id, partition, step.step)
        for part in step.parts:
            name = slice_step_part(step.step, part.file)
            _link(folder / part.file, tmp / name)
            parts.append(part.model_copy(update={"file": name}))
    parts += _write_parts(table, n_parts, tmp)
    if steps:
        offsets = dict(fields["offsets"])
        for topic in {t for s in steps for t in s.offsets} | set(offsets):
            ranges = [s.offsets[topic] for s in steps if topic in s.offsets]
            offsets[topic] = _merged([*ranges, *([offsets[topic]] if topic in offsets else [])])
        counts = sum((s.counts for s in steps), fields["counts"])
        fields = {**fields, "offsets": offsets, "counts": counts}
    matured_parts = []
    if matured is not None and matured.num_rows:
        pq.write_table(matured, tmp / MATURED_PART)
        rows = matured.num_rows
        matured_parts.append(
            PartInfo(file=MATURED_PART, rows=rows, sha256=sha256_file(tmp / MATURED_PART))
        )
    manifest = SliceManifest(
        schema_version=schema_version,
        pass_id=pass_id,
        partition=partition,
        rows=table.num_rows + sum(s.rows for s in steps),
        positives=_positives(table) + sum(s.positives for s in steps),
        parts=parts,
        matured_parts=matured_parts,
        steps=[s.step for s in steps],
        created_at=datetime.now(UTC).isoformat(),
        **fields,
    )
    if not _publish(tmp, final, SLICE_MANIFEST_NAME, manifest):
        raise SliceTaken(read_slice(final))
    write_text_atomic(latest_slice_index(data_root, partition), json.dumps({"pass_id": pass_id}))
    return manifest


def latest_slice(data_root: Path, partition: int, clock: PassClock) -> SliceManifest | None:
    """The newest slice of ``partition``: from the index file, then forward while newer
    slices exist (a crash can leave the index one behind); a full scan without an index."""
    index = latest_slice_index(data_root, partition)
    newest: str | None = None
    if index.is_file():
        newest = json.loads(index.read_text())["pass_id"]
    else:
        found = [
            w for w in slice_pass_ids(data_root) if is_complete(slice_dir(data_root, w, partition))
        ]
        newest = max(found, default=None)
    if newest is None:
        return None
    while is_complete(slice_dir(data_root, clock.next(newest), partition)):
        newest = clock.next(newest)
    return read_slice(slice_dir(data_root, newest, partition))


def slice_pass_ids(data_root: Path) -> set[str]:
    """Pass ids with a slices folder: a slice of theirs is published, or being written."""
    return set(by_day(slices_root(data_root), is_pass_id).names)


def slice_listing(data_root: Path) -> Listing:
    """Every partition's slice folder (names ``<pass_id>/p<N>``), and the writers'
    temporaries in the day folders, in each window's folder and among its steps."""
    root = slices_root(data_root)
    windows = by_day(root, is_pass_id)
    inside = []
    for window in windows.names:
        listing = list_folder(root / day_of(window) / window, is_partition_name)
        inside.append(Listing(tuple(f"{window}/{p}" for p in listing.names), listing.leftovers))
        steps = root / day_of(window) / window / "steps"
        for partition in list_folder(steps, is_partition_name).names:
            inside.append(Listing((), list_folder(steps / partition, str.isdigit).leftovers))
    return Listing.joined([Listing((), windows.leftovers), *inside])


def slice_partitions(data_root: Path) -> set[int]:
    """Every partition with a slice folder of some window."""
    return {int(name.rpartition("/p")[2]) for name in slice_listing(data_root).names}


def builder_leftovers(data_root: Path) -> Listing:
    """The writers' temporaries a pass builder may have left: slices, passes, and its
    index and hold notes."""
    layout = DataLayout(Path(data_root))
    topics = list_folder(layout.holds, bool).names
    notes = [layout.latest_slices, *(layout.holds / topic for topic in topics)]
    return Listing.joined(
        [
            Listing((), slice_listing(data_root).leftovers),
            Listing((), pass_listing(data_root).leftovers),
            *(Listing((), list_folder(d, bool, directories=False).leftovers) for d in notes),
        ]
    )


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem: copy instead
        shutil.copy2(src, dst)


def assemble_pass(
    data_root: Path, pass_id: str, partitions: int, schema_version: int, clock: PassClock
) -> PassManifest | None:
    """Build the pass directory once every partition has its slice of the window, or has
    cut past it without one; None until then.

    A partition cuts its windows in order, each once, so one whose newest slice is later
    than ``pass_id`` and that has none of ``pass_id`` never will: it had nothing there
    (its first slice came after the window, or the window lay in a run of empty windows it
    jumped), and any event of it that comes now is late. Without this, a window another
    partition's slice showed up in only after such a jump waited for ever."""
    final = pass_dir(data_root, pass_id)
    if is_complete(final):
        return read_manifest(final)
    dirs = []
    for partition in range(partitions):
        directory = slice_dir(data_root, pass_id, partition)
        if is_complete(directory):
            dirs.append(directory)
            continue
        newest = latest_slice(data_root, partition, clock)
        if newest is None or newest.pass_id <= pass_id:
            return None
    slices = [read_slice(d) for d in dirs]
    tmp = temp_dir_for(final)
    parts, matured = [], []
    for s, d in zip(slices, dirs, strict=True):
        for part in s.parts:
            name = pass_part(s.partition, part.file)
            _link(d / part.file, tmp / name)
            parts.append(part.model_copy(update={"file": name}))
        for part in s.matured_parts:
            name = pass_part(s.partition, part.file)
            _link(d / part.file, tmp / name)
            matured.append(part.model_copy(update={"file": name}))
    start, end = clock.window(pass_id)
    by_topic: dict[str, dict[str, Any]] = {"offsets": {}, "resume_offsets": {}, "consumed_to": {}}
    for s in slices:
        for key in by_topic:
            for topic, value in getattr(s, key).items():
                by_topic[key].setdefault(topic, {})[str(s.partition)] = value
    counts = sum((s.counts for s in slices), EventCounts())
    manifest = PassManifest(
        schema_version=schema_version,
        pass_id=pass_id,
        window_start_ms=start,
        window_end_ms=end,
        partitions=partitions,
        rows=sum(s.rows for s in slices),
        positives=sum(s.positives for s in slices),
        parts=parts,
        matured_parts=matured,
        counts=counts,
        created_at=datetime.now(UTC).isoformat(),
        **by_topic,
    )
    if not _publish(tmp, final, PASS_MANIFEST_NAME, manifest):
        return read_manifest(final)
    log.info(
        "pass %s complete: %d rows from %d partitions (%d with a slice of it)",
        *(pass_id, manifest.rows, partitions, len(slices)),
    )
    return manifest
