"""The pass contract: ids, windows, directories and the manifest.

Grammar::

    pass_id   = YYYYMMDDHHMM[SS]         UTC start of the event-time window (PassClock)
    window    = [start, start + passes.pass_seconds)
    pass dir  = <data_root>/passes/<YYYYMMDD>/<pass_id>/
                  part-00000.parquet ...  the rows, split into parts
                  matured-00000.parquet   impressions with their final labels, when a
                                          label is written before its window closes
                  _manifest.json          PassManifest (MANIFEST_VERSION)
                  _SUCCESS                empty donefile: the pass is complete

    slice dir = <data_root>/slices/<YYYYMMDD>/<pass_id>/p<partition>/
                  part-00000.parquet ...  the rows of one partition of the window
                  s<K>-part-00000.parquet  its steps' parts, linked in (passes.step_seconds)
                  _slice.json             SliceManifest: offsets and resume point of that partition
                  _SUCCESS
    step dir  = <data_root>/slices/<YYYYMMDD>/<pass_id>/steps/p<partition>/<KKK>/
                  part-00000.parquet ...  the partition's rows of the open window read up to
                                          step K's cut and not in an earlier step
                  _step.json              StepManifest: offsets, resume point, counts
                  _SUCCESS
    latest    = <data_root>/slices/_latest/p<partition>.json   {"pass_id": newest slice}
    held      = <data_root>/slices/_held/<topic>/p<partition>.json   PartitionHold, while an
                open transaction keeps the partition's next window from closing

Each partition of the impressions topic writes its own slice of every window; when every
partition's slice exists, the pass directory is assembled from hard links to the slice
parts. Slices and passes are built under a temporary name and renamed into place with
``_SUCCESS`` already inside, so each exists whole or not at all, and a second writer's
rename fails instead of replacing the first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from streamrec.errors import ContractError
from streamrec.layout import DataLayout, day_of
from streamrec.listing import Listing, list_folder

MANIFEST_VERSION = 1
PASS_MANIFEST_NAME = "_manifest.json"
SUCCESS_NAME = "_SUCCESS"
SLICE_MANIFEST_NAME = "_slice.json"
STEP_MANIFEST_NAME = "_step.json"
_ID_FORMATS = {12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}  # by length: minutes, seconds
DAY_SECONDS = 86_400
_PASS_KEYED = re.compile(r"(?P<pass_id>\d{12}(?:\d{2})?)-[A-Za-z0-9_]+")
M = TypeVar("M", bound=BaseModel)


def parse_pass_id(pass_id: str) -> datetime:
    """The UTC window start of ``pass_id``; ContractError when it is neither
    ``YYYYMMDDHHMM`` nor ``YYYYMMDDHHMMSS``."""
    try:
        if len(pass_id) not in _ID_FORMATS or not pass_id.isdigit():
            raise ValueError
        return datetime.strptime(pass_id, _ID_FORMATS[len(pass_id)]).replace(tzinfo=UTC)
    except ValueError:
        raise ContractError(f"pass id {pass_id!r} is not YYYYMMDDHHMM or YYYYMMDDHHMMSS") from None


@dataclass(frozen=True)
class PassClock:
    """The pass windows of a pipeline: ``seconds`` long, from midnight UTC, so every day
    ends on a window's end. Built once from config (``PassConfig.clock``); it names a
    window (its id), bounds it, steps to the next and says where a day ends.

    A window's id is its UTC start, ``YYYYMMDDHHMM`` when windows are whole minutes and
    ``YYYYMMDDHHMMSS`` when they are shorter. Ids of either length sort by their start (a
    minute's id is a prefix of its first second's), so a pipeline whose windows shrink keeps
    its history in order."""

    seconds: int

    def __post_init__(self) -> None:
        if self.seconds <= 0 or DAY_SECONDS % self.seconds:
            raise ValueError(f"a pass of {self.seconds} s does not divide a day")

    @property
    def width_ms(self) -> int:
        return self.seconds * 1000

    @property
    def _format(self) -> str:
        return _ID_FORMATS[12 if self.seconds % 60 == 0 else 14]

    def id_at(self, event_time_ms: int) -> str:
        """The id of the window that holds ``event_time_ms`` (epoch milliseconds, UTC)."""
        start = (event_time_ms // self.width_ms) * self.width_ms
        return datetime.fromtimestamp(start / 1000, tz=UTC).strftime(self._format)

    def id_of(self, moment: datetime) -> str:
        """The id of the window that holds ``moment`` (an aware datetime: an Airflow data
        interval's start is its window's)."""
        return self.id_at(int(moment.timestamp() * 1000))

    def window(self, pass_id: str) -> tuple[int, int]:
        """``[start, end)`` of the pass's window in epoch milliseconds."""
        start = int(parse_pass_id(pass_id).timestamp() * 1000)
        return start, start + self.width_ms

    def next(self, pass_id: str) -> str:
        """The id of the window right after ``pass_id``'s."""
        return self.id_at(self.window(pass_id)[1])

    def closes_day(self, pass_id: str) -> bool:
        """True for the last pass of a logical (UTC) day: the daily maintenance runs after it."""
        return day_of(self.next(pass_id)) != day_of(pass_id)

    def floor(self, moment: datetime) -> datetime:
        """The start of the window holding ``moment``, in UTC."""
        return parse_pass_id(self.id_of(moment))


def is_pass_id(name: str) -> bool:
    """Whether ``name`` parses as a pass id."""
    try:
        parse_pass_id(name)
    except ContractError:
        return False
    return True


def is_pass_keyed(name: str) -> bool:
    """Whether ``name`` is ``<pass_id>-<word>``: a checkpoint save, a raw export, a score
    run (``streamrec.layout``)."""
    keyed = _PASS_KEYED.fullmatch(name)
    return keyed is not None and is_pass_id(keyed["pass_id"])


def is_day(name: str) -> bool:
    """Whether ``name`` is a day folder, ``YYYYMMDD``."""
    return len(name) == 8 and name.isdigit()


def _on_day(day: str, accepts: Callable[[str], bool]) -> Callable[[str], bool]:
    """``accepts``, narrowed to the names whose pass id falls on ``day``."""
    return lambda name: accepts(name) and day_of(name) == day


def by_day(root: Path, accepts: Callable[[str], bool]) -> Listing:
    """The entries of every day folder under ``root`` (``<root>/<day>/<pass_id>...``) whose
    name ``accepts`` and whose pass id falls on that day."""
    days = list_folder(root, is_day)
    within = [list_folder(root / day, _on_day(day, accepts)) for day in days.names]
    return Listing.joined([Listing((), days.leftovers), *within])


def pass_dir(data_root: Path, pass_id: str) -> Path:
    """Directory of ``pass_id`` under ``data_root``."""
    parse_pass_id(pass_id)
    return DataLayout(Path(data_root)).pass_dir(pass_id)


def slices_root(data_root: Path) -> Path:
    """Root of every partition's slices."""
    return DataLayout(Path(data_root)).slices


def slice_dir(data_root: Path, pass_id: str, partition: int) -> Path:
    """Directory of partition ``partition``'s slice of ``pass_id``."""
    parse_pass_id(pass_id)
    return DataLayout(Path(data_root)).slice_dir(pass_id, partition)


def step_dir(data_root: Path, pass_id: str, partition: int, step: int) -> Path:
    """Directory of step ``step`` of partition ``partition``'s rows of ``pass_id``."""
    parse_pass_id(pass_id)
    return DataLayout(Path(data_root)).step_dir(pass_id, partition, step)


def published_steps(data_root: Path, pass_id: str, partition: int) -> list[int]:
    """The steps of ``partition``'s rows of ``pass_id`` published so far, in order."""
    folder = DataLayout(Path(data_root)).steps_dir(pass_id, partition)
    names = list_folder(folder, str.isdigit).names
    return sorted(int(n) for n in names if is_complete(folder / n))


def published_step_names(data_root: Path, pass_id: str) -> list[str]:
    """Every partition's published steps of ``pass_id`` as ``"<partition>/<step>"``, the
    earlier steps first."""
    folder = DataLayout(Path(data_root)).steps_of(pass_id)
    found = [
        (step, int(name[1:]))
        for name in list_folder(folder, is_partition_name).names
        for step in published_steps(data_root, pass_id, int(name[1:]))
    ]
    return [f"{partition}/{step}" for step, partition in sorted(found)]


def slice_step_part(step: int, file: str) -> str:
    """The name a step's part takes in its partition's slice (and, prefixed by the
    partition, in the pass: ``pass_part``)."""
    return f"s{step:03d}-{file}"


def pass_part(partition: int, file: str) -> str:
    """The name a slice's part takes in the pass."""
    return f"p{partition}-{file}"


def latest_slice_index(data_root: Path, partition: int) -> Path:
    """File naming the newest slice of ``partition`` (a hint; slices are the truth)."""
    return DataLayout(Path(data_root)).latest_slice_index(partition)


def hold_path(data_root: Path, topic: str, partition: int) -> Path:
    """Where the builder notes that an open transaction holds ``topic``'s ``partition``."""
    return DataLayout(Path(data_root)).holds / topic / f"p{partition}.json"


def is_complete(directory: Path) -> bool:
    """True when the pass directory carries its donefile."""
    return (directory / SUCCESS_NAME).is_file()


class PartInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    file: str = Field(description="File name inside the pass directory.")
    rows: int
    sha256: str


class PartitionRange(BaseModel):
    model_config = ConfigDict(frozen=True)

    first: int = Field(description="Lowest offset of a row in this pass.")
    last: int = Field(description="Highest offset of a row in this pass.")
    rows: int


class RowKind(IntEnum):
    """What a row is for one label (its ``kind_<label>`` column), in passes where a label is
    written before its window closes (``schema.labels[].emit``)."""

    ABSENT = 0  # the row does not train this label's task
    OBSERVED = 1  # the impression with the label as observed when the row was written
    DUPLICATE = 2  # a copy of the impression, positive: its label came after it was written
    MATURED = 3  # the impression with its final label (``matured_parts``): judged, not trained


class LabelCounts(BaseModel):
    """One label's rows and the label events that labelled none, while a slice or pass was
    open."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    positives: int = Field(0, description="Rows written with this label 1.")
    late: int = Field(0, description="Label events later than the label's window.")
    duplicate: int = Field(0, description="Repeated label events for an impression.")
    unmatched: int = Field(0, description="Label events whose impression was not pending.")
    unattributed: int = Field(
        0, description="Positives whose row lacked the label they require (kept or dead-lettered)."
    )
    observed: int = Field(
        0,
        description="Observed rows of this label (a schema with a label written before its "
        "window closed; else 0, and every row is the label's).",
    )
    duplicates: int = Field(0, description="Duplicate positives written for a later label.")
    open: int = Field(
        0,
        description="Impressions whose row was written and whose window for this label was "
        "still open when the slice was cut (a pass: summed over its slices).",
    )

    def __add__(self, other: LabelCounts) -> LabelCounts:
        return LabelCounts(
            **{k: getattr(self, k) + getattr(other, k) for k in LabelCounts.model_fields}
        )


class EventCounts(BaseModel):
    """Events not in the rows, counted while a slice or pass was open."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    malformed: dict[str, int] = Field(
        default_factory=dict, description="reason -> events sent to the dead-letter topic."
    )
    late: int = Field(0, description="Impressions for windows already closed.")
    labels: dict[str, LabelCounts] = Field(
        default_factory=dict, description="label name -> its counts (schema.labels)."
    )
    waiting: int = Field(
        0,
        description="Impressions held in memory, waiting for their labels, when the slice "
        "was cut (a pass: summed over its slices).",
    )
    matured: int = Field(0, description="Impressions written with their final labels (matured).")

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())

    def label_total(self, field: str) -> int:
        """``field`` (late, unmatched, ...) summed over the labels."""
        return sum(getattr(c, field) for c in self.labels.values())

    def __add__(self, other: EventCounts) -> EventCounts:
        malformed = dict(self.malformed)
        for reason, n in other.malformed.items():
            malformed[reason] = malformed.get(reason, 0) + n
        labels = dict(self.labels)
        for name, counts in other.labels.items():
            labels[name] = labels[name] + counts if name in labels else counts
        return EventCounts(
            malformed=malformed,
            late=self.late + other.late,
            labels=labels,
            waiting=self.waiting + other.waiting,
            matured=self.matured + other.matured,
        )


class SliceManifest(BaseModel):
    """One partition's share of a window, and where that partition resumes after it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_version: int = MANIFEST_VERSION
    schema_version: int
    pass_id: str
    partition: int
    rows: int
    positives: int
    parts: list[PartInfo]
    matured_parts: list[PartInfo] = Field(
        default_factory=list, description="Matured rows (RowKind.MATURED), apart from the rows."
    )
    offsets: dict[str, PartitionRange] = Field(
        description="topic -> offsets of what this slice holds: its impressions, and the "
        "clicks that labelled them."
    )
    resume_offsets: dict[str, int] = Field(
        description="topic -> offset to consume from after this slice: the lowest offset still "
        "held for a later window, else the next unread offset."
    )
    consumed_to: dict[str, int] = Field(
        description="topic -> next offset not yet read when the slice was cut."
    )
    counts: EventCounts
    steps: list[int] = Field(
        default_factory=list,
        description="The partition's steps of the window (passes.step_seconds) whose parts "
        "this slice holds, linked in under their step's name; its rows and counts include them.",
    )
    created_at: str


class StepManifest(BaseModel):
    """Rows of one partition for the open pass, read up to a step's cut (final once
    published), and where that partition resumes after them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_version: int = MANIFEST_VERSION
    schema_version: int
    pass_id: str
    partition: int
    step: int
    rows: int
    positives: int
    parts: list[PartInfo]
    offsets: dict[str, PartitionRange] = Field(description="topic -> offsets of its rows.")
    resume_offsets: dict[str, int] = Field(
        description="topic -> offset to consume from after this step."
    )
    consumed_to: dict[str, int] = Field(
        description="topic -> next offset not yet read when the step was cut: every row of "
        "the pass below it is in this step or an earlier one."
    )
    counts: EventCounts = Field(description="What was counted since the previous cut.")
    created_at: str


class PassManifest(BaseModel):
    """What a pass holds and where in Kafka its rows came from (all partitions)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_version: int = MANIFEST_VERSION
    schema_version: int = Field(description="Feature schema version of the rows.")
    pass_id: str
    window_start_ms: int
    window_end_ms: int
    partitions: int = Field(description="Partitions of the impressions topic, one slice each.")
    rows: int
    positives: int
    parts: list[PartInfo]
    matured_parts: list[PartInfo] = Field(
        default_factory=list,
        description="Impressions with their final labels, written once every window of "
        "theirs closed (passes with a label written earlier): judged and, for after_wait, "
        "the delay models' rows; never the model's training rows.",
    )
    offsets: dict[str, dict[str, PartitionRange]] = Field(
        description="topic -> partition -> offsets of the rows in this pass."
    )
    resume_offsets: dict[str, dict[str, int]] = Field(
        description="topic -> partition -> where each partition resumes after its slice."
    )
    consumed_to: dict[str, dict[str, int]] = Field(
        description="topic -> partition -> next offset not yet read when its slice was cut."
    )
    counts: EventCounts
    created_at: str


class PartitionHold(BaseModel):
    """A partition whose read stopped short of the topic's end: under read_committed that is
    an open transaction, whose window (and every later one) waits until it ends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int
    pass_id: str | None = Field(description="The partition's oldest window not yet cut.")
    position: int = Field(description="Next offset to read: the last stable offset.")
    since: float = Field(description="Epoch seconds of the partition's last record read.")


def read_holds(data_root: Path) -> list[PartitionHold]:
    """Every hold the builders have noted (an unreadable note is skipped: it is a hint)."""
    holds = []
    for path in sorted(DataLayout(Path(data_root)).holds.glob("*/p*.json")):
        try:
            holds.append(PartitionHold.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue  # removed or being replaced while we looked
    return holds


def _read(directory: Path, name: str, model: type[M], what: str) -> M:
    if not is_complete(directory):
        raise ContractError(f"{directory} has no {SUCCESS_NAME}: the {what} is not complete")
    try:
        return model.model_validate_json((directory / name).read_text())
    except (OSError, ValueError) as e:
        raise ContractError(f"{directory / name}: unreadable manifest: {e}") from e


def read_manifest(directory: Path) -> PassManifest:
    """The manifest of a complete pass directory."""
    return _read(directory, PASS_MANIFEST_NAME, PassManifest, "pass")


def read_step(directory: Path) -> StepManifest:
    """The manifest of a complete step directory."""
    return _read(directory, STEP_MANIFEST_NAME, StepManifest, "step")


def read_slice(directory: Path) -> SliceManifest:
    """The manifest of a complete slice directory."""
    return _read(directory, SLICE_MANIFEST_NAME, SliceManifest, "slice")


def manifest_json(manifest: BaseModel) -> str:
    """The manifest as written to disk."""
    return json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True)


PassState = Literal["complete", "never", "pending"]


def pass_state(data_root: Path, pass_id: str) -> tuple[PassState, str]:
    """Whether ``pass_id`` is ``complete``, will ``never`` be (a later pass is complete and
    no partition wrote a slice of this window: it precedes the stream, or lies in a gap the
    builder skipped), or is still ``pending``; with a sentence saying why."""
    directory = pass_dir(data_root, pass_id)
    if is_complete(directory):
        return "complete", f"{directory} is complete"
    done = complete_passes(data_root)  # one scan per poke
    later = [p for p in done if p > pass_id]
    sliced = slice_dir(data_root, pass_id, 0).parent  # a slice of it published or being written
    if later and not sliced.exists():
        return "never", (
            f"no pass for window {pass_id} will come: pass {later[0]} after it is complete and "
            f"no partition wrote a slice of it (before the stream began, or a skipped gap)"
        )
    newest = done[-1] if done else "none yet"
    return "pending", f"waiting for {directory / SUCCESS_NAME} (newest complete pass {newest})"


def is_partition_name(name: str) -> bool:
    """Whether ``name`` is a partition's slice folder, ``p<N>``."""
    return name[:1] == "p" and name[1:].isdigit()


def pass_listing(data_root: Path) -> Listing:
    """Every pass directory under ``data_root`` (complete or not), and the writers'
    temporaries beside them."""
    return by_day(DataLayout(Path(data_root)).passes, is_pass_id)


def complete_passes(data_root: Path, since: str | None = None) -> list[str]:
    """Ids of every complete pass under ``data_root``, oldest first (a writer's temporary
    is never one, donefile or not); with ``since``, only those from that id on, found
    without a look at an earlier day or pass (a follower asks ten times a second, beside a
    week of passes)."""
    layout = DataLayout(Path(data_root))
    if since is None:
        names = pass_listing(data_root).names
    else:
        first_day = day_of(since)
        days = [d for d in list_folder(layout.passes, is_day).names if d >= first_day]
        names = tuple(
            name
            for day in days
            for name in list_folder(
                layout.passes / day,
                _on_day(day, lambda n: n >= since and is_pass_id(n)),
            ).names
        )
    return [p for p in names if is_complete(layout.pass_dir(p))]
