"""Cut the impression (and label) topics into event-time passes, each event in exactly one.

One pass through this stage, per partition ``p`` this builder owns::

    poll -> parse (bad: to <topic>.dlq with the reason, counted) -> PartitionJoin of p
         -> watermark(p) = min over p's topics of their newest event time - allowed lateness
         -> each window W with end(W) [+ the longest label window] <= watermark(p) is cut:
            p's slice of W (its rows with every label that came in time; label events that
            labelled none counted, and dead-lettered where their label says so)
            is published by rename (Parquet + _slice.json with p's resume offsets), then p's
            offsets are committed
         -> when every partition has its slice of W, the pass directory is assembled

Under ``read_committed`` (the default) a partition is read up to its last stable offset:
an aborted transaction's events never arrive, and an open transaction stops the read there,
so the partition's watermark, and with it every window from the open transaction's on,
waits for the transaction to end (noted under ``slices/_held`` for ``streamrec status``).
Messages from any client are read alike: keys and headers are ignored (dead letters keep
them), and a missing event time is a dead letter or the record's timestamp
(``kafka.missing_event_time``).

The parts: ``streaming.kafka_source`` (the consumer in the group and the dead-letter
producer), ``streaming.join`` (per-partition join state), ``streaming.windows`` (the
watermark and the windows it completes, pure) and ``streaming.slice_writer`` (slices written
off the polling thread); this module keeps each owned partition's state and runs the loop.

Partitions are the unit of ownership, so builders can share topics through a consumer
group: on assignment a partition resumes from its newest slice's ``resume_offsets``
(whatever Kafka's committed offsets say), or from its spill store's checkpoint where the
join had spilled past ``passes.join_memory_mib`` (``streaming.join_spill``), on
revocation its state is dropped, and a slice
that someone else published first (``SliceTaken``) makes the partition resume from that
one. Impressions and label events are keyed by ``event_id`` and co-partitioned, and the range
assignor gives the same partition of both topics to the same builder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from streaming.builder_metrics import (
    SNAPSHOT_SECONDS,
    BuilderSnapshot,
    PartitionFigures,
    TopicPartitionFigures,
    serve_builder_metrics,
)
from streaming.codecs import missing_codecs
from streaming.emit_plan import joined_labels, plan_of
from streaming.errors import MalformedEvent
from streaming.events import (
    carried_labels,
    decode_impression_batch,
    parse_event,
    parse_label_event,
    pass_table_schema,
)
from streaming.join import IMPRESSIONS, PartitionJoin, Stray
from streaming.join_spill import SpillSettings
from streaming.kafka_source import KafkaSource
from streaming.slice_writer import SliceWriter
from streaming.slices import (
    assemble_pass,
    builder_leftovers,
    latest_slice,
    parts_per_slice,
    slice_pass_ids,
)
from streaming.windows import WindowCutter, watermark_ms
from streamrec.atomic_fs import remove_leftovers, write_text_atomic
from streamrec.config import EMBEDDED, PipelineConfig, kind_column, label_column, load_config
from streamrec.entry import run_command
from streamrec.errors import StreamrecError
from streamrec.layout import Layout
from streamrec.passes import (
    EventCounts,
    LabelCounts,
    PartitionHold,
    PartitionRange,
    PassManifest,
    RowKind,
    SliceManifest,
    StepManifest,
    hold_path,
    is_complete,
    pass_dir,
    published_steps,
    read_slice,
    read_step,
    slice_dir,
    step_dir,
)

log = logging.getLogger(__name__)

RESCAN_SECONDS = 2.0
# drain: the watermark of a stream that has ended, past every window and label window of
# any event time the contract accepts (below 2**62)
END_OF_STREAM_MS = 2**63
# a poll's wait when nothing is decoding or writing, and when something is (its result is
# taken in after the poll: at 50 ms a quiet stream's pass was complete up to 0.1 s later)
POLL_MS, IN_FLIGHT_POLL_MS = 500, 10


@dataclass
class _Partition:
    """What the builder holds for one owned partition."""

    join: PartitionJoin
    resume: dict[str, int]  # kind -> where the newest slice says to resume
    consumed_to: dict[str, int] = field(default_factory=dict)
    newest_ms: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)  # kinds whose read an open transaction stops
    steps: dict[str, list[StepManifest]] = field(default_factory=dict)  # window -> published


@dataclass
class _Batch:
    """One poll's messages of one topic-partition, on their way into the join."""

    state: _Partition  # the owner's state when polled; a different one means "drop"
    topic: str
    partition: int
    kind: str
    messages: list[Any]
    record_times: list[int] | None  # what a missing event time falls back to, if configured
    decoded: Future[pa.Table | None] | None = None  # impressions: the Arrow decode

    def timed(self) -> Iterator[tuple[Any, int | None]]:
        """Each message with the time its missing event time falls back to (None: none)."""
        times = self.record_times or repeat(None, len(self.messages))
        return zip(self.messages, times, strict=True)


def _count(kinds: pa.ChunkedArray, kind: RowKind) -> int:
    return int(pc.sum(pc.equal(kinds, int(kind))).as_py() or 0)


def _named(cut: SliceManifest | StepManifest) -> str:
    return f"{cut.pass_id} step {cut.step}" if isinstance(cut, StepManifest) else cut.pass_id


def _ranges(table: pa.Table) -> PartitionRange | None:
    if table.num_rows == 0:
        return None
    offsets = table["kafka_offset"].to_numpy()
    return PartitionRange(first=int(offsets.min()), last=int(offsets.max()), rows=table.num_rows)


class PassBuilder:
    """Consumes the topics and writes slices and complete passes. Built without I/O:
    ``open`` (or the first ``run``) prepares the topics, the clients and the data root."""

    def __init__(
        self,
        cfg: PipelineConfig,
        consumer_factory: Callable[[], KafkaConsumer] | None = None,
        dlq_factory: Callable[[], KafkaProducer] | None = None,
    ) -> None:
        if cfg.kafka.bootstrap_servers == EMBEDDED:
            raise StreamrecError("kafka.bootstrap_servers is 'embedded': start the services first")
        self.cfg = cfg
        self._root = Path(cfg.paths.data_root)
        self._clock = cfg.passes.clock
        self._record_time = cfg.kafka.missing_event_time == "record_timestamp"
        self._carried = carried_labels(cfg.labels)
        self._joined = joined_labels(cfg.labels)
        self._plan = plan_of(cfg)
        self._time_key = {label.name: label.time_key for label in cfg.topic_labels}
        self.topics = {IMPRESSIONS: cfg.pass_topic}
        self.topics |= {label.name: label.topic for label in cfg.topic_labels if label.topic}
        self._kind = {topic: kind for kind, topic in self.topics.items()}
        self._served = cfg.served_tasks
        self._arrow_schema = pass_table_schema(cfg.feature_schema, self._served)
        self._rows_schema = pa.schema(
            [*self._arrow_schema, *self._plan.row_fields()], metadata=self._arrow_schema.metadata
        )
        self._lateness_ms = cfg.passes.allowed_lateness_seconds * 1000
        cut_delay_ms = self._plan.cut_delay_ms
        self._windows = WindowCutter(self._clock, cut_delay_ms, cfg.passes.max_gap_passes)
        step = cfg.passes.step_seconds
        self._step_ms = step * 1000 if step else None
        self._steps_per_pass = cfg.passes.steps_per_pass
        self._owned: dict[int, _Partition] = {}
        self._future_limit_ms = 0.0
        self._known: set[str] = set()  # pass ids with at least one slice
        self._complete: set[str] = set()  # ... of which the pass directory exists
        self._next_scan = 0.0
        self._source = KafkaSource(cfg, self.topics, consumer_factory, dlq_factory)
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._writer: SliceWriter | None = None
        self.partitions = 0  # known once open
        # for the metrics: (topic, partition) -> records read, and the newest one's
        # timestamp (epoch ms); passes assembled; the newest snapshot and when it was taken
        self._records: dict[tuple[str, int], int] = {}
        self._record_ms: dict[tuple[str, int], int] = {}
        self._assembled = 0
        self.snapshot: BuilderSnapshot | None = None
        self._snapshot_at = 0.0

    def open(self) -> None:
        """Prepare the topics and start the clients; clear temporary files a killed
        builder left under the slices. ``run`` opens the builder if this was not called."""
        if self._writer is not None:
            return
        if missing := missing_codecs():
            log.warning(
                "Kafka codecs %s are not installed: a batch compressed with one stops the "
                "builder (pip install -e . installs them)",
                ", ".join(missing),
            )
        self.partitions = self._source.open(self.acquire, self.release)
        parts = parts_per_slice(self.cfg.passes.parts_per_pass, self.partitions)
        grace_s = self.cfg.retention.leftover_minutes * 60
        for removed in remove_leftovers(builder_leftovers(self._root).leftovers, grace_s):
            log.info("removed a crashed writer's leftover %s: %s", removed.path, removed.why)
        self._writer = SliceWriter(
            self._root, self.cfg.feature_schema.version, parts, self.partitions
        )

    @property
    def _slices(self) -> SliceWriter:
        if self._writer is None:
            raise RuntimeError("the pass builder is not open")
        return self._writer

    # -- ownership -----------------------------------------------------------------------

    def _steps_after(self, partition: int, closed: str | None) -> dict[str, list[StepManifest]]:
        """``partition``'s published steps of the windows after ``closed``."""
        found = {}
        for window in sorted(slice_pass_ids(self._root)):
            if closed is None or window > closed:
                numbers = published_steps(self._root, window, partition)
                steps = [read_step(step_dir(self._root, window, partition, k)) for k in numbers]
                if steps:
                    found[window] = steps
        return found

    def _load(self, partition: int) -> _Partition:
        newest_slice = latest_slice(self._root, partition, self._clock)
        closed = newest_slice.pass_id if newest_slice else None
        steps = self._steps_after(partition, closed) if self._step_ms else {}
        # where to resume: the newest cut, slice or step (a step of a later window can be
        # older than the slice of an earlier one)
        impressions = self.topics[IMPRESSIONS]
        cuts: list[SliceManifest | StepManifest] = [s for done in steps.values() for s in done]
        if newest_slice is not None:
            cuts.append(newest_slice)
        newest = max(cuts, key=lambda c: c.consumed_to.get(impressions, -1), default=None)
        by_kind = {
            kind: (newest.resume_offsets.get(topic) if newest else None)
            for kind, topic in self.topics.items()
        }
        replay = {
            kind: newest.consumed_to[topic]
            for kind, topic in self.topics.items()
            if newest and topic in newest.consumed_to
        }
        join = PartitionJoin(
            labels=self._joined,
            closed_through=closed,
            replay_to=replay,
            plan=self._plan,
            clock=self._clock,
            cut_consumed=lambda window: self._cut_consumed(partition, window),
            spill=self._spill_settings(partition),
        )
        join.step_consumed = {w: done[-1].consumed_to[impressions] for w, done in steps.items()}
        resume = {k: v for k, v in by_kind.items() if v is not None}
        now = time.monotonic()
        state = _Partition(
            join=join, resume=resume, last_seen={k: now for k in self.topics}, steps=steps
        )
        restored = join.restore()
        if restored is not None:  # the spill store's checkpoint is newer than the slice
            state.resume, state.newest_ms = dict(restored[0]), dict(restored[1])
            state.consumed_to = dict(restored[0])
        log.info(
            "partition %d: resuming after %s at %s%s",
            partition,
            _named(newest) if newest else "nothing",
            state.resume or "the beginning",
            f" from its spill store ({join.waiting():,} rows waiting)" if restored else "",
        )
        return state

    def _spill_settings(self, partition: int) -> SpillSettings | None:
        """Where ``partition``'s join spills past its share of ``passes.join_memory_mib``
        (None: it never spills)."""
        budget = self.cfg.passes.join_memory_mib
        if budget is None:
            return None
        made_by = f"{self._rows_schema}|{self._plan!r}|{self._clock.seconds}"
        return SpillSettings(
            Layout.of(self.cfg.paths).join_spill(self.cfg.kafka.consumer_group, partition),
            max(budget // max(self.partitions, 1), 1),
            hashlib.sha256(made_by.encode()).hexdigest(),
        )

    def _checkpoint(self, partition: int, state: _Partition) -> None:
        """Move ``partition``'s join state into its spill store with where it has read to
        (its strays dead-lettered first: the store's counts include them)."""
        self._dead_letter_strays(partition, state.join.take_strays())
        self._source.flush_dead_letters()
        read_to = {k: state.consumed_to.get(k, state.resume.get(k, 0)) for k in self.topics}
        state.join.checkpoint(read_to, dict(state.newest_ms))

    def _spill_if_full(self, partition: int) -> None:
        """Checkpoint ``partition``'s join once its memory is past its budget (not while a
        slice of it is being written: the checkpoint names the newest cut as published)."""
        state = self._owned.get(partition)
        if state is None or not state.join.over_budget():
            return
        settled = self._finish_write(partition, wait=False)
        if settled and self._owned.get(partition) is state and state.join.over_budget():
            self._checkpoint(partition, state)

    def _cut_consumed(self, partition: int, window: str) -> int | None:
        """The impression offset ``partition`` had read up to when it cut ``window`` (None:
        its slice is gone): a replayed impression of a closed window below it was held."""
        directory = slice_dir(self._root, window, partition)
        if not is_complete(directory):
            return None
        return read_slice(directory).consumed_to.get(self.topics[IMPRESSIONS])

    def _seek(self, partition: int, state: _Partition, tps: list[TopicPartition]) -> None:
        for tp in tps:
            # no slice yet: from the beginning; the manifests, not the group's commits, decide
            self._source.seek(tp, state.resume.get(self._kind[tp.topic]))

    def acquire(self, assigned: Any) -> None:
        """Take over newly assigned partitions: state from their newest slice, then seek."""
        for tp in assigned:
            if tp.partition not in self._owned:
                self._owned[tp.partition] = self._load(tp.partition)
            self._seek(tp.partition, self._owned[tp.partition], [tp])

    def release(self, revoked: Any) -> None:
        """Forget revoked partitions; their next owner resumes from their newest slice
        (a slice still being written is finished first, so the next owner sees it)."""
        for tp in revoked:
            self._finish_write(tp.partition)
            if (state := self._owned.pop(tp.partition, None)) is not None:
                state.join.close_store()
                for kind in list(state.held):
                    self._release_hold(tp.partition, state, kind)

    def _resync(self, partition: int) -> None:
        if (old := self._owned.get(partition)) is not None:
            old.join.close_store()
        state = self._load(partition)
        self._owned[partition] = state
        self._seek(partition, state, [TopicPartition(t, partition) for t in self.topics.values()])

    # -- event time ------------------------------------------------------------------------

    def _submit(self, topic: str, partition: int, messages: list[Any], now: float) -> _Batch | None:
        """Start decoding one poll's messages of one topic-partition in the decoder thread
        (Arrow parses without the GIL, so this overlaps with the next poll)."""
        state = self._owned.get(partition)
        if state is None:
            return None  # revoked while the batch was in flight
        times = [m.timestamp for m in messages] if self._record_time else None
        batch = _Batch(state, topic, partition, self._kind[topic], messages, times)
        read = (topic, partition)
        self._records[read] = self._records.get(read, 0) + len(messages)
        self._record_ms[read] = messages[-1].timestamp
        # news from the poll, not from the apply a loop later: the poll already moved the
        # position to the end, and a partition caught up and quiet since its last apply
        # would look idle, letting other partitions' event times cut windows this batch
        # holds events of
        state.last_seen[batch.kind] = now
        if batch.kind == IMPRESSIONS:
            batch.decoded = self._decoder.submit(
                decode_impression_batch,
                [m.value for m in messages],
                [m.offset for m in messages],
                partition,
                self.cfg.feature_schema,
                self.cfg.kafka.max_message_bytes,
                carried=self._carried,
                served=self._served,
            )
        return batch

    def _apply(self, batch: _Batch) -> None:
        """Validate and buffer a submitted batch; dropped if its partition changed hands or
        was resynced since the poll (the consumer was sought back to re-read it)."""
        state, partition, messages = batch.state, batch.partition, batch.messages
        if self._owned.get(partition) is not state:
            return
        if batch.kind == IMPRESSIONS:
            self._ingest_impressions(state, batch)
        else:
            for m, record_time in batch.timed():
                self._ingest_label(state, batch, m, record_time)
        state.consumed_to[batch.kind] = messages[-1].offset + 1

    def _ingest_impressions(self, state: _Partition, batch: _Batch) -> None:
        table = batch.decoded.result() if batch.decoded else None
        if table is not None:
            times = table.column("event_time_ms")
            newest = pc.max(times).as_py()
            if newest <= self._future_limit_ms or newest <= self._refresh_future_limit():
                windows = self._windows.pass_ids_of(times.to_numpy())
                state.join.add_impressions(windows, table)
                self._saw(state, IMPRESSIONS, newest)
                return
        self._ingest_impressions_one_by_one(state, batch)

    def _ingest_impressions_one_by_one(self, state: _Partition, batch: _Batch) -> None:
        """The slow path for a batch the column-wise decoder declined (a bad event, a
        missing time): each message is judged alone, each bad one dead-lettered with its
        reason."""
        rows, windows, newest = [], [], 0
        partition = batch.partition
        for message, record_time in batch.timed():
            offset = message.offset
            try:
                row = parse_event(
                    message.value,
                    self.cfg.feature_schema,
                    self.cfg.kafka.max_message_bytes,
                    carried=self._carried,
                    record_time_ms=record_time,
                    served=self._served,
                )
                event_ms = self._check_time(row["event_time_ms"])
            except MalformedEvent as e:
                if state.join.malformed(IMPRESSIONS, offset, e.reason):
                    self._source.dead_letter(batch.topic, partition, message, e)
                continue
            row["kafka_partition"], row["kafka_offset"] = partition, offset
            rows.append(row)
            windows.append(self._windows.pass_id_of(event_ms))
            newest = max(newest, event_ms)
        if rows:
            state.join.add_impressions(
                windows, pa.Table.from_pylist(rows, schema=self._arrow_schema)
            )
            self._saw(state, IMPRESSIONS, newest)

    def _ingest_label(
        self, state: _Partition, batch: _Batch, message: Any, record_time: int | None
    ) -> None:
        kind, max_bytes = batch.kind, self.cfg.kafka.max_message_bytes
        try:
            event_id, event_ms = parse_label_event(
                message.value, max_bytes, self._time_key[kind], record_time
            )
            state.join.add_label(kind, event_id, self._check_time(event_ms), message.offset)
        except MalformedEvent as e:
            if state.join.malformed(kind, message.offset, e.reason):
                self._source.dead_letter(batch.topic, batch.partition, message, e)
            return
        self._saw(state, kind, event_ms)

    def _dead_letter_strays(self, partition: int, strays: list[Stray]) -> None:
        """Send label events that labelled no row to the dead-letter topic, as the events
        they were (the original record stays in its topic at the offset named)."""
        for stray in strays:
            time_key = self._time_key[stray.kind]
            value = json.dumps({"event_id": stray.event_id, time_key: stray.time_ms})
            why = MalformedEvent(stray.reason, f"{stray.reason} {stray.kind} event")
            self._source.dead_letter_value(
                self.topics[stray.kind], partition, stray.offset, value.encode(), why
            )

    @staticmethod
    def _saw(state: _Partition, kind: str, event_ms: int) -> None:
        if event_ms > state.newest_ms.get(kind, 0):
            state.newest_ms[kind] = event_ms

    def _check_time(self, event_ms: int) -> int:
        # the limit moves with the wall clock; re-read it only when an event reaches it
        if event_ms > self._future_limit_ms and event_ms > self._refresh_future_limit():
            raise MalformedEvent("future_time", f"event time {event_ms} is past the wall clock")
        return event_ms

    def _refresh_future_limit(self) -> float:
        self._future_limit_ms = (time.time() + self.cfg.passes.max_future_seconds) * 1000
        return self._future_limit_ms

    def watermark_ms(self, partition: int, now: float | None = None) -> int:
        """Event time up to which partition ``partition`` has seen everything
        (``streaming.windows.watermark_ms``). A topic is idle when it is caught up with the
        broker *and* without news for ``idle_partition_seconds``: a partition with a backlog
        is never idle, however long the other one keeps the consumer busy."""
        now = time.monotonic() if now is None else now
        state = self._owned[partition]
        idle_s = self.cfg.passes.idle_partition_seconds
        idle = {
            kind
            for kind in self.topics
            if now - state.last_seen[kind] >= idle_s
            and self._source.caught_up(self.topics[kind], partition)
        }
        # only when every topic here is idle does the newest time of any partition count
        newest_anywhere = 0
        if len(idle) == len(self.topics):
            newest_anywhere = max(
                (t for s in self._owned.values() for t in s.newest_ms.values()), default=0
            )
        return watermark_ms(state.newest_ms, self.topics, idle, newest_anywhere, self._lateness_ms)

    # -- open transactions -------------------------------------------------------------------

    def _watch_holds(self, now: float) -> None:
        """Note each owned partition whose read stopped short of the topic's end with
        nothing new for ``idle_partition_seconds``: under read_committed, a transaction left
        open there (its window waits; ``streamrec status`` shows the note). Written once: a
        held partition reads nothing, so neither its position nor its window moves."""
        if self.cfg.kafka.isolation_level != "read_committed":
            return
        idle_s = self.cfg.passes.idle_partition_seconds
        for partition, state in self._owned.items():
            for kind, topic in self.topics.items():
                high = self._source.highwater(topic, partition)
                quiet = now - state.last_seen[kind] >= idle_s
                if (
                    quiet
                    and high is not None
                    and (position := self._source.position(topic, partition)) < high
                ):
                    if kind not in state.held:
                        self._note_hold(partition, state, kind, position, high, now)
                elif kind in state.held:
                    self._release_hold(partition, state, kind)
                    log.info("%s/%d: the transaction ended; reading on", topic, partition)

    def _note_hold(
        self, partition: int, state: _Partition, kind: str, position: int, high: int, now: float
    ) -> None:
        closed, pending = state.join.closed_through, state.join.pending
        held_window = self._clock.next(closed) if closed else min(pending, default=None)
        topic = self.topics[kind]
        hold = PartitionHold(
            topic=topic,
            partition=partition,
            pass_id=held_window,
            position=position,
            since=time.time() - (now - state.last_seen[kind]),
        )
        log.warning(
            "%s/%d: nothing read for %.0f s and %d offsets short of the topic's end: a "
            "transaction open at offset %d holds window %s until it commits or aborts",
            topic,
            partition,
            now - state.last_seen[kind],
            high - position,
            position,
            held_window or "(the first)",
        )
        state.held.add(kind)
        write_text_atomic(hold_path(self._root, topic, partition), hold.model_dump_json())

    def _release_hold(self, partition: int, state: _Partition, kind: str) -> None:
        state.held.discard(kind)
        hold_path(self._root, self.topics[kind], partition).unlink(missing_ok=True)

    # -- cutting ---------------------------------------------------------------------------

    def _rescan(self, force: bool = False) -> None:
        if force or time.monotonic() >= self._next_scan:
            self._known |= slice_pass_ids(self._root)
            self._watch_holds(time.monotonic())
            self._next_scan = time.monotonic() + RESCAN_SECONDS

    def _read_points(self, state: _Partition) -> tuple[dict[str, int], dict[str, int]]:
        """Per topic, where the partition resumes after a cut now (the lowest offset still
        held, else the next unread one) and the next unread offset."""
        resume, consumed = {}, {}
        for kind, topic in self.topics.items():
            read_to = state.consumed_to.get(kind, state.resume.get(kind, 0))
            lowest = state.join.lowest_needed(kind)
            resume[topic] = read_to if lowest is None else min(lowest, read_to)
            consumed[topic] = read_to
        return resume, consumed

    def _step(self, partition: int) -> None:
        """Write a step of the oldest open window of ``partition`` once the watermark is a
        step boundary further into it (``passes.step_seconds``): its rows held now, final."""
        if self._step_ms is None:
            return
        state = self._owned[partition]
        closed = state.join.closed_through
        window = min((w for w in state.join.pending if closed is None or w > closed), default=None)
        if window is None:
            return
        start = self._clock.window(window)[0]
        due = min((self.watermark_ms(partition) - start) // self._step_ms, self._steps_per_pass - 1)
        done = state.steps.get(window)
        if due <= (done[-1].step if done else 0) or not self._finish_write(partition, wait=False):
            return
        if self._owned.get(partition) is not state:
            return
        table = state.join.take_step(window)
        if table is None:
            return
        counts = self._counts(state.join, table, None).model_copy(update={"waiting": 0})
        resume, consumed = self._read_points(state)
        rows_range = _ranges(table)
        fields: dict[str, Any] = {
            "offsets": {self.topics[IMPRESSIONS]: rows_range} if rows_range else {},
            "resume_offsets": resume,
            "consumed_to": consumed,
            "counts": counts,
        }
        self._source.flush_dead_letters()  # its dead letters are durable before it is
        self._slices.submit_step(partition, window, int(due), table, fields, state, resume)

    def _cut(self, partition: int, window: str) -> None:
        state = self._owned[partition]
        table = state.join.close(window)
        if table is None:
            table = self._rows_schema.empty_table()
        matured = state.join.matured
        counts = self._counts(state.join, table, matured)
        resume, consumed = self._read_points(state)
        offsets = {}
        if (rows_range := _ranges(table)) is not None:
            offsets[self.topics[IMPRESSIONS]] = rows_range
        for kind, used in state.join.used_offsets.items():
            offsets[self.topics[kind]] = PartitionRange(
                first=min(used), last=max(used), rows=len(used)
            )
        self._dead_letter_strays(partition, state.join.take_strays())
        # dead letters counted in this slice are durable before it is
        self._source.flush_dead_letters()
        fields = {
            "offsets": offsets,
            "resume_offsets": resume,
            "consumed_to": consumed,
            "counts": counts,
        }
        steps = tuple(state.steps.pop(window, []))
        self._slices.submit(partition, window, table, fields, state, resume, matured, steps)

    def _counts(
        self, join: PartitionJoin, table: pa.Table, matured: pa.Table | None
    ) -> EventCounts:
        """The slice's counts: the join's since the last slice, each label's positives (and,
        written before its window closed, observed rows and duplicates) in ``table``, the
        labels still open, and the rows still waiting."""
        counters = join.take_counters()
        labels = {}
        for i, label in enumerate(self.cfg.labels):
            column = table[label_column(i, label.name)]
            joined = counters.labels.get(label.name)
            written = {}
            if self._plan.delayed:
                kinds = table[kind_column(label.name)]
                written = {
                    "observed": _count(kinds, RowKind.OBSERVED),
                    "duplicates": _count(kinds, RowKind.DUPLICATE),
                    "open": join.open.get(label.name, 0),
                }
            labels[label.name] = LabelCounts(
                positives=int(pc.sum(column).as_py() or 0),
                **(vars(joined) if joined else {}),
                **written,
            )
        return EventCounts(
            malformed=dict(counters.malformed),
            late=counters.late_impressions,
            labels=labels,
            waiting=join.waiting(),
            matured=matured.num_rows if matured is not None else 0,
        )

    def _finish_write(self, partition: int, wait: bool = True) -> bool:
        """Settle ``partition``'s slice in flight, if any. False when the partition cannot
        cut now: the write is still running (``wait=False``), or it lost to someone else's
        slice and the partition was resynced from that one."""
        if not wait and self._slices.running(partition):
            return False
        written = self._slices.settle(partition)
        if written is None:
            return True
        owned = self._owned.get(partition) is written.owner
        if written.taken is not None:
            log.warning("%s; partition %d resumes from it", written.taken, partition)
            if owned:
                self._resync(partition)
            return False
        if written.step is None:
            self._known.add(written.window)
        elif owned:
            written.owner.steps.setdefault(written.window, []).append(written.step)
        if owned:
            written.owner.resume = {self._kind[t]: o for t, o in written.resume.items()}
            self._source.commit(partition, written.resume)
            if written.owner.join.spilled:
                self._checkpoint(partition, written.owner)
        return True

    def _settle_writes(self) -> None:
        """Take in every slice whose write has ended, so its pass assembles on this turn of
        the loop: not at the partition's next cut or the next rescan, up to
        ``RESCAN_SECONDS`` later (0.02-1.57 s after the last slice, measured)."""
        for partition in self._slices.partitions():
            self._finish_write(partition, wait=False)

    def _finish_writes(self) -> None:
        if self._writer is not None:
            for partition in self._slices.partitions():
                self._finish_write(partition)

    def _cut_ready(self, partition: int, watermark: int | None = None) -> bool:
        """Cut every window of ``partition`` that is complete (at ``watermark``: its own
        unless given), oldest first, with no gaps; whether it cut any."""
        state = self._owned[partition]
        watermark = self.watermark_ms(partition) if watermark is None else watermark
        state.join.expire_unmatched(watermark)
        closed = state.join.closed_through
        candidates = set(state.join.pending) | state.join.due_windows()
        candidates |= {p for p in self._known if closed is None or p > closed}
        candidates |= set(state.steps)  # every row stepped: nothing pending, still to cut
        windows = self._windows.to_cut(candidates, closed, watermark)
        if not windows or not self._finish_write(partition, wait=False):
            return False
        for i, window in enumerate(windows):
            if i and not self._finish_write(partition):
                return True  # the partition was resynced from someone else's slice
            if closed is not None and window != (expected := self._clock.next(closed)):
                log.warning(
                    "partition %d: skipping the empty windows %s up to %s (passes.max_gap_passes)",
                    *(partition, expected, window),
                )
            self._cut(partition, window)
            closed = window
            # a spilled join's cut changed its store: published and checkpointed at once
            if state.join.spilled and not self._finish_write(partition):
                return True
        return True

    def _read_to(self, ends: dict[int, dict[str, int]]) -> bool:
        """Whether every owned partition is read up to ``ends`` (partition -> topic ->
        offset), noting the end of a partition seen for the first time."""
        done = True
        for partition in self._owned:
            if partition not in ends:
                ends[partition] = self._source.end_offsets(partition)
            done &= all(
                self._source.position(topic, partition) >= end
                for topic, end in ends[partition].items()
            )
        return done and bool(self._owned)

    def _cut_everything(self) -> None:
        """The stream has ended: cut every window each owned partition holds, with the
        labels seen so far (label events still unmatched count as such), and the empty
        slices another partition's windows need, until no partition has anything left."""
        while True:
            self._finish_writes()
            self._rescan(force=True)
            cut = [self._cut_ready(p, END_OF_STREAM_MS) for p in sorted(self._owned)]
            if not any(cut):
                break
        self._finish_writes()

    def _assemble(self) -> list[PassManifest]:
        done = []
        for pass_id in sorted(self._known - self._complete):
            if is_complete(pass_dir(self._root, pass_id)):
                self._complete.add(pass_id)  # never looked at again on this hot path
                continue
            manifest = assemble_pass(
                self._root, pass_id, self.partitions, self.cfg.feature_schema.version, self._clock
            )
            if manifest is not None:
                self._complete.add(pass_id)
                done.append(manifest)
        self._assembled += len(done)
        return done

    # -- metrics ---------------------------------------------------------------------------

    def _take_snapshot(self, now: float) -> None:
        """Refresh ``snapshot`` (what ``/metrics`` shows) at most every ``SNAPSHOT_SECONDS``,
        on the polling thread: the Kafka client is not thread-safe."""
        if now < self._snapshot_at:
            return
        self._snapshot_at = now + SNAPSHOT_SECONDS
        wall_ms = time.time() * 1000
        reads, joins = [], []
        for partition, state in sorted(self._owned.items()):
            for topic in self.topics.values():
                high = self._source.highwater(topic, partition)
                lag = (
                    None if high is None else max(0, high - self._source.position(topic, partition))
                )
                newest = self._record_ms.get((topic, partition))
                seconds = None
                if lag == 0:
                    seconds = 0.0
                elif lag is not None and newest is not None:
                    seconds = max(0.0, (wall_ms - newest) / 1000)
                dead = {
                    reason: n
                    for (t, p, reason), n in self._source.dead_letters.items()
                    if t == topic and p == partition
                }
                records = self._records.get((topic, partition), 0)
                reads.append(TopicPartitionFigures(topic, partition, lag, seconds, records, dead))
            watermark = self.watermark_ms(partition, now)
            joins.append(
                PartitionFigures(
                    partition,
                    watermark if state.newest_ms else None,
                    state.join.waiting(),
                    dict(state.join.open),
                )
            )
        self.snapshot = BuilderSnapshot(tuple(reads), tuple(joins), self._assembled)

    def run(
        self,
        until_pass: str | None = None,
        idle_timeout_s: float | None = None,
        stop: threading.Event | None = None,
        drain: bool = False,
    ) -> list[PassManifest]:
        """Consume and cut until pass ``until_pass`` is complete, nothing arrives for
        ``idle_timeout_s``, or ``stop`` is set. With ``drain`` (a replay or backfill of a
        finished log), read every owned partition to its end as of when it was first owned,
        then cut every window left and stop. Returns the passes this builder completed."""
        self.open()
        completed: list[PassManifest] = []
        last_data = time.monotonic()
        in_flight: list[_Batch] = []  # the previous poll's batches, decoding
        ends: dict[int, dict[str, int]] = {}  # drain: partition -> topic -> its end
        while not (stop and stop.is_set()):
            # with batches decoding or slices writing, poll briefly: they are settled after it
            busy = in_flight or self._slices.busy
            records = self._source.poll(IN_FLIGHT_POLL_MS if busy else POLL_MS)
            now = time.monotonic()
            if records or in_flight:
                last_data = now
            elif idle_timeout_s is not None and now - last_data > idle_timeout_s:
                break
            submitted = [self._submit(tp.topic, tp.partition, m, now) for tp, m in records.items()]
            for batch in in_flight:
                self._apply(batch)
            for partition in {b.partition for b in in_flight}:
                self._spill_if_full(partition)
            in_flight = [b for b in submitted if b is not None]
            self._rescan()
            self._settle_writes()
            for partition in sorted(self._owned):
                self._cut_ready(partition)
                self._step(partition)
            completed += self._assemble()
            self._take_snapshot(now)
            if until_pass and is_complete(pass_dir(self._root, until_pass)):
                break
            if drain and not in_flight and self._read_to(ends):
                log.info("read to the end of the stream: cutting every window left")
                self._cut_everything()
                break
        for batch in in_flight:  # the consumer's positions are past them: keep them
            self._apply(batch)
        self._finish_writes()
        return completed + self._assemble()

    def close(self) -> None:
        self._finish_writes()
        for partition, state in self._owned.items():  # nobody watches them any more
            state.join.close_store()
            for kind in list(state.held):
                self._release_hold(partition, state, kind)
        self._decoder.shutdown()
        if self._writer is not None:
            self._writer.close()
        self._source.close()


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the CLI reference is generated from them)."""
    parser = argparse.ArgumentParser(
        prog="streamrec build-passes",
        description="Cut the impression and label topics into passes.",
    )
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML")
    parser.add_argument("--until-pass", help="stop once this pass id is complete")
    parser.add_argument("--idle-timeout", type=float, help="stop after this many idle seconds")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve the builder's metrics (consumer lag, watermarks, waiting rows, dead "
        "letters) on this port's /metrics for Prometheus; off unless given",
    )
    parser.add_argument(
        "--metrics-host", default="0.0.0.0", help="listen address of --metrics-port"
    )
    parser.add_argument(
        "--drain",
        action="store_true",
        help="the stream has ended (a replay, a backfill): read every partition to its end "
        "as of the start, cut every window left, assemble the passes and stop; run it "
        "alone, or on every builder of the group",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    return run_command(lambda: _build(args))


def _build(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    builder = PassBuilder(cfg)
    stop_metrics = None
    if args.metrics_port is not None:
        stop_metrics = serve_builder_metrics(
            cfg.name, lambda: builder.snapshot, args.metrics_host, args.metrics_port
        )
    try:
        builder.run(until_pass=args.until_pass, idle_timeout_s=args.idle_timeout, drain=args.drain)
    finally:
        builder.close()
        if stop_metrics is not None:
            stop_metrics()
    return 0


if __name__ == "__main__":
    sys.exit(main())
