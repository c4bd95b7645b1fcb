"""One partition's waiting rows on local disk, in RocksDB (rocksdict): the join's cold tier.

The join keeps new state in memory (its hot tier) and, past its share of
``passes.join_memory_mib``, moves all of it here in one atomic write batch together with
where the partition had read to: a *checkpoint*. So the store always holds the whole join
state as of one checkpoint, and a restarted builder resumes from it instead of replaying
the topics from the newest slice's resume offsets. Between checkpoints the store only
changes when a cut writes rows: their entries are deleted at once, after marking the
store *dirty*; a builder killed before the next checkpoint finds it dirty and replays as
if there were no store (``docs/decisions/``, "Waiting rows on disk").

The held rows themselves are Arrow IPC files beside the database (``segments/``), written
and synced before the checkpoint that names them, read back memory-mapped: RocksDB keeps
the small entries, where its memtable, write-ahead log and compactions would otherwise
copy gigabytes of rows again and again (``docs/decisions/``).

Keys (one column family; prefixes keep each kind together and in order):

    i<event id>                          -> the held impression's time (int64)
    l<label>\\0<event id>                 -> its label event (time, offset, flags)
    d<due time, big-endian><event id>\\0<label> -> a duplicate positive to write
    u<label>\\0<event id>                 -> an unmatched label event (rewritten whole)
    m                                    -> the checkpoint (JSON)
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import rocksdict

from streamrec.atomic_fs import temp_path_for

MIB = 1 << 20
_TIME = struct.Struct("<q")
_EVENT = struct.Struct("<qqB")  # time, offset, flags (replayed 1, late 2)
_DUE = struct.Struct(">Q")  # sorts as the time does: shifted past the sign
_SHIFT = 1 << 63
META = b"m"


@dataclass(frozen=True)
class SpillSettings:
    """Where a partition's join spills, and within how much memory its hot tier and the
    store's caches stay."""

    path: Path
    memory_mib: int
    fingerprint: str  # what the rows were made by: a checkpoint of another is not restored

    @property
    def store_mib(self) -> int:
        """The store's block cache and write buffers: an eighth of the budget, at least
        one MiB (RocksDB's own floor is a few)."""
        return max(self.memory_mib // 8, 1)

    @property
    def hot_bytes(self) -> int:
        """What the hot tier may hold before it is checkpointed to the store: three
        quarters of the rest, the last quarter for what the estimate misses (the store's
        bloom filters and indexes, the allocators' slack: bench/label_memory.py)."""
        return (self.memory_mib - self.store_mib) * MIB * 3 // 4


@dataclass
class LabelEvent:
    """A label event the join holds."""

    time_ms: int
    offset: int
    replayed: bool
    late: bool = False  # read after the row it belonged in was written


def pack_event(event: LabelEvent) -> bytes:
    return _EVENT.pack(event.time_ms, event.offset, event.replayed | event.late << 1)


def unpack_event(value: bytes) -> LabelEvent:
    time_ms, offset, flags = _EVENT.unpack(value)
    return LabelEvent(time_ms, offset, bool(flags & 1), bool(flags & 2))


def _label_keys(prefix: bytes, kind: str, event_ids: Iterable[str]) -> list[bytes]:
    head = prefix + kind.encode() + b"\0"
    return [head + event_id.encode() for event_id in event_ids]


def _due_key(due_ms: int, event_id: str, kind: str) -> bytes:
    return b"d" + _DUE.pack(due_ms + _SHIFT) + event_id.encode() + b"\0" + kind.encode()


@dataclass(frozen=True)
class Segment:
    """Held rows on disk: where, how many, the lowest offset, and their times per second
    (``seconds[i]`` rows at second ``first_s + i``), enough to count without reading."""

    key: str  # its file under segments/
    rows: int
    min_offset: int
    first_s: int
    seconds: np.ndarray

    def count_between(self, start_ms: int, end_ms: int) -> int:
        """Rows with a time in [start_ms, end_ms), both whole seconds."""
        lo = min(max(start_ms // 1000 - self.first_s, 0), len(self.seconds))
        hi = min(max(end_ms // 1000 - self.first_s, 0), len(self.seconds))
        return int(self.seconds[lo:hi].sum())

    def to_json(self) -> list[Any]:
        return [self.key, self.rows, self.min_offset, self.first_s, self.seconds.tolist()]

    @classmethod
    def from_json(cls, value: list[Any]) -> Segment:
        key, rows, min_offset, first_s, seconds = value
        return cls(key, rows, min_offset, first_s, np.array(seconds, np.int64))


def segment_of(key: str, table: pa.Table) -> Segment:
    """The segment handle of ``table`` stored under ``key``."""
    seconds = table["event_time_ms"].to_numpy() // 1000
    first = int(seconds.min())
    return Segment(
        key,
        table.num_rows,
        int(table["kafka_offset"].to_numpy().min()),
        first,
        np.bincount(seconds - first),
    )


def _write_synced(path: Path, table: pa.Table) -> None:
    """``table`` as an Arrow IPC file at ``path``, on disk before this returns."""
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    tmp.replace(path)


class SpillStore:
    """The cold tier of one partition's join (module docstring)."""

    def __init__(self, path: Path, memory_mib: int) -> None:
        """Open (or create) the store at ``path``, its block cache and write buffers within
        ``memory_mib``."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(max(memory_mib // 4, 4) * MIB)
        opts.set_max_write_buffer_number(2)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(rocksdict.Cache(max(memory_mib // 2, 8) * MIB))
        table.set_bloom_filter(10, False)  # most lookups are of ids not held
        opts.set_block_based_table_factory(table)
        self.path = path
        self._segments = path / "segments"
        self._segments.mkdir(parents=True, exist_ok=True)
        self._db = rocksdict.Rdict(str(path / "db"), opts)
        self._sync = rocksdict.WriteOptions()
        self._sync.sync = True
        self._dirty = False

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def remove(path: Path) -> None:
        """Delete the store at ``path`` (nothing there is fine)."""
        shutil.rmtree(path, ignore_errors=True)

    # -- the checkpoint ----------------------------------------------------------------

    def meta(self) -> dict[str, Any] | None:
        """The newest checkpoint, or None when there is none or a cut has changed the
        store since (it is dirty)."""
        value = self._db.get(META)
        if value is None:
            return None
        meta = json.loads(value)
        return meta if meta.get("clean") else None

    def _mark_dirty(self) -> None:
        if not self._dirty:
            self._db.put(META, json.dumps({"clean": False}).encode(), self._sync)
            self._dirty = True

    def checkpoint(
        self,
        *,
        impressions: dict[str, int],
        labels: dict[str, dict[str, LabelEvent]],
        duplicates: Iterable[tuple[int, str, str]],
        segments: list[tuple[str, pa.Table]],
        unmatched: dict[str, dict[str, LabelEvent]],
        meta: dict[str, Any],
    ) -> None:
        """Add the hot tier's state and replace the unmatched events and the checkpoint's
        description, all in one synced write batch (the segments' files first)."""
        for key, table in segments:
            _write_synced(self._segments / key, table)
        if segments:
            descriptor = os.open(self._segments, os.O_RDONLY)
            try:
                os.fsync(descriptor)  # the renames too
            finally:
                os.close(descriptor)
        batch = rocksdict.WriteBatch(raw_mode=True)
        for event_id, time_ms in impressions.items():
            batch.put(b"i" + event_id.encode(), _TIME.pack(time_ms))
        for kind, events in labels.items():
            for held, event in zip(_label_keys(b"l", kind, events), events.values(), strict=True):
                batch.put(held, pack_event(event))
        for due_ms, event_id, kind in duplicates:
            batch.put(_due_key(due_ms, event_id, kind), b"")
        batch.delete_range(b"u", b"v")
        for kind, events in unmatched.items():
            for held, event in zip(_label_keys(b"u", kind, events), events.values(), strict=True):
                batch.put(held, pack_event(event))
        batch.put(META, json.dumps({**meta, "clean": True}).encode())
        self._db.write(batch, self._sync)
        self._dirty = False

    # -- reading -------------------------------------------------------------------------

    def impression_times(self, event_ids: list[str]) -> list[int | None]:
        """The held time of each impression (None: not held here)."""
        values = self._get_many([b"i" + e.encode() for e in event_ids])
        return [None if v is None else _TIME.unpack(v)[0] for v in values]

    def label_events(self, kind: str, event_ids: list[str]) -> list[LabelEvent | None]:
        """The held ``kind`` event of each impression (None: none here)."""
        values = self._get_many(_label_keys(b"l", kind, event_ids))
        return [None if v is None else unpack_event(v) for v in values]

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Each key's value (None: absent): rocksdict's multi-get, which its stubs type as
        a one-key get."""
        many: Any = keys
        return cast(list[bytes | None], self._db.get(many))

    def segment(self, key: str) -> pa.Table:
        """A segment's rows, memory-mapped."""
        return pa.ipc.open_file(pa.memory_map(str(self._segments / key))).read_all()

    def prune(self, keep: set[str]) -> None:
        """Delete segment files no checkpoint names (written by a checkpoint that did not
        commit)."""
        for path in self._segments.iterdir():
            if path.name not in keep:
                path.unlink()

    def unmatched(self) -> Iterator[tuple[str, str, LabelEvent]]:
        """Every unmatched label event of the checkpoint: (label, event id, event)."""
        for key, value in self._prefix(b"u", b"v"):
            kind, event_id = key[1:].decode().split("\0", 1)
            yield kind, event_id, unpack_event(value)

    def first_due(self) -> int | None:
        """When the earliest duplicate held here is due (None: none)."""
        for key, _ in self._prefix(b"d", b"e"):
            return _DUE.unpack(key[1:9])[0] - _SHIFT
        return None

    def take_due(self, before_ms: int) -> list[tuple[int, str, str]]:
        """The duplicates due before ``before_ms``, deleted from the store."""
        end = b"d" + _DUE.pack(before_ms + _SHIFT)
        due = []
        for key, _ in self._prefix(b"d", end):
            event_id, kind = key[9:].decode().split("\0", 1)
            due.append((_DUE.unpack(key[1:9])[0] - _SHIFT, event_id, kind))
        if due:
            self._mark_dirty()
            self._db.delete_range(b"d", end, self._sync)
        return due

    def _prefix(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(start)
        while it.valid() and (key := it.key()) < end:
            yield key, it.value()
            it.next()

    # -- a cut's deletions ------------------------------------------------------------------

    def delete(
        self,
        *,
        impressions: Sequence[str] = (),
        labels: Mapping[str, Sequence[str]] | None = None,
        segments: Sequence[str] = (),
    ) -> None:
        """Delete written rows' entries (the store is dirty until the next checkpoint)."""
        if not (impressions or segments or any((labels or {}).values())):
            return
        self._mark_dirty()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for event_id in impressions:
            batch.delete(b"i" + event_id.encode())
        for kind, ids in (labels or {}).items():
            for held in _label_keys(b"l", kind, ids):
                batch.delete(held)
        self._db.write(batch)
        for key in segments:
            (self._segments / key).unlink()


def _open_idle(path: Path) -> rocksdict.Rdict | None:
    """The store's database if no process has it open (None: in use, or no database)."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(False)
    try:
        return rocksdict.Rdict(str(path / "db"), opts)
    except Exception as e:  # rocksdict raises a bare Exception with RocksDB's status
        if "lock file" in str(e) or "does not exist" in str(e):
            return None
        raise


def _stale_reason(db: rocksdict.Rdict | None, newest_slice: str | None) -> str | None:
    if db is None:  # a builder has it open, or is creating it
        return None
    value = db.get(META)
    meta = json.loads(value) if value is not None else None
    if meta is None or not meta.get("clean"):
        return "no clean checkpoint (a cut since): a restart replays from the newest slice"
    if meta["closed_through"] != newest_slice:
        return (
            f"checkpointed after the cut of {meta['closed_through']}, but the partition's "
            f"newest slice is {newest_slice} (cut by its next owner)"
        )
    return None


def stale_reason(path: Path, newest_slice: str | None) -> str | None:
    """Why the idle spill store at ``path`` can never be resumed from, ``newest_slice``
    being its partition's newest slice (the check ``PartitionJoin.restore`` makes), or
    None: a builder has it open, or a builder taking the partition would resume from it."""
    db = _open_idle(path)
    try:
        return _stale_reason(db, newest_slice)
    finally:
        if db is not None:
            db.close()


def remove_if_stale(path: Path, newest_slice: str | None) -> str | None:
    """Remove the store at ``path`` if it is stale (the reason; None: kept). Checked again
    while holding the store's lock, and renamed away (to a writer's temporary name: a
    crash before it is deleted leaves an ordinary leftover) before the lock is let go, so
    a builder taking the partition afterwards finds nothing and replays from the newest
    slice (one taking it in the instant the lock is held fails to open the store and
    exits, to be restarted as after any crash)."""
    db = _open_idle(path)
    try:
        why = _stale_reason(db, newest_slice)
        if why is not None:
            gone = temp_path_for(path)
            path.rename(gone)
    finally:
        if db is not None:
            db.close()
    if why is not None:
        shutil.rmtree(gone, ignore_errors=True)
    return why
