"""Cut the impression topic into event-time passes, each written once as Parquet + manifest.

One pass through this stage::

    poll -> parse_event (bad: counted, skipped) -> buffer by window (compose_pass_id)
         -> watermark = min over partitions of their max event time - allowed lateness
            (a partition idle for idle_partition_seconds stops holding it back)
         -> every window ending at or before the watermark is written: parts in a temp dir,
            _manifest.json, _SUCCESS, rename into place -> then Kafka offsets are committed

The manifests are the source of truth, not Kafka's committed offsets. Each manifest records
``consumed_to`` (next unread offset per partition) and ``resume_offsets`` (the lowest offset
still buffered for a later window). On start the builder seeks to the newest manifest's
``resume_offsets``; replayed events below ``consumed_to`` whose window is already closed were
written (or counted late) before, so they are skipped without being counted again. A crash
at any point therefore leaves each event in exactly one pass.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from streaming.errors import MalformedEvent
from streaming.events import parse_event, pass_table_schema
from streaming.topics import CONSUMER_TIMEOUTS, ensure_topic
from streamrec.atomic_fs import publish_dir, remove_stale_temps, temp_dir_for
from streamrec.config import EMBEDDED, PipelineConfig, load_config
from streamrec.errors import StreamrecError
from streamrec.logs import setup_logging
from streamrec.passes import (
    MANIFEST_NAME,
    SUCCESS_NAME,
    PartInfo,
    PartitionRange,
    PassManifest,
    complete_passes,
    compose_pass_id,
    manifest_json,
    next_pass_id,
    pass_dir,
    read_manifest,
    window_ms,
)

log = logging.getLogger(__name__)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_pass(
    cfg: PipelineConfig, pass_id: str, table: pa.Table, manifest_fields: dict[str, Any]
) -> PassManifest:
    """Write ``table`` as the pass directory of ``pass_id``, atomically; return its manifest."""
    final = pass_dir(cfg.paths.data_root, pass_id)
    tmp = temp_dir_for(final)
    n_parts = min(cfg.passes.parts_per_pass, table.num_rows)
    parts = []
    for i in range(n_parts):
        a, b = i * table.num_rows // n_parts, (i + 1) * table.num_rows // n_parts
        name = f"part-{i:05d}.parquet"
        pq.write_table(table.slice(a, b - a), tmp / name)
        parts.append(PartInfo(file=name, rows=b - a, sha256=_sha256(tmp / name)))
    start, end = window_ms(pass_id, cfg.passes.pass_minutes)
    manifest = PassManifest(
        schema_version=cfg.feature_schema.version,
        pass_id=pass_id,
        window_start_ms=start,
        window_end_ms=end,
        rows=table.num_rows,
        positives=int(pc.sum(table["label"]).as_py() or 0),
        parts=parts,
        created_at=datetime.now(UTC).isoformat(),
        **manifest_fields,
    )
    (tmp / MANIFEST_NAME).write_text(manifest_json(manifest))
    (tmp / SUCCESS_NAME).touch()
    publish_dir(tmp, final)
    return manifest


def _offset_ranges(table: pa.Table) -> dict[str, PartitionRange]:
    if table.num_rows == 0:
        return {}
    grouped = table.group_by("kafka_partition").aggregate(
        [("kafka_offset", "min"), ("kafka_offset", "max"), ("kafka_offset", "count")]
    )
    return {
        str(p): PartitionRange(first=lo, last=hi, rows=n)
        for p, lo, hi, n in zip(
            grouped["kafka_partition"].to_pylist(),
            grouped["kafka_offset_min"].to_pylist(),
            grouped["kafka_offset_max"].to_pylist(),
            grouped["kafka_offset_count"].to_pylist(),
            strict=True,
        )
    }


class _SeekToManifest(ConsumerRebalanceListener):
    def __init__(self, builder: PassBuilder) -> None:
        self._builder = builder

    def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._builder.seek_assigned(assigned)


class PassBuilder:
    """Consumes the impressions topic and writes complete passes."""

    def __init__(
        self, cfg: PipelineConfig, consumer_factory: Callable[[], KafkaConsumer] | None = None
    ):
        if EMBEDDED in (cfg.kafka.bootstrap_servers,):
            raise StreamrecError("kafka.bootstrap_servers is 'embedded': start the services first")
        self.cfg = cfg
        self._topic = cfg.kafka.impressions_topic
        self._arrow_schema = pass_table_schema(cfg.feature_schema)
        self._lateness_ms = cfg.passes.allowed_lateness_seconds * 1000
        self._open: dict[str, list[dict[str, Any]]] = {}
        self._consumed_to: dict[int, int] = {}
        self._partition_max: dict[int, int] = {}
        self._partition_seen: dict[int, float] = {}
        self.malformed = Counter[str]()
        self._late = 0
        self._closed_through: str | None = None
        self._replay_to: dict[int, int] = {}
        self._resume: dict[int, int] = {}
        self._restore_from_disk()
        self._consumer = (consumer_factory or self._default_consumer)()

    def _default_consumer(self) -> KafkaConsumer:
        ensure_topic(self.cfg.kafka.bootstrap_servers, self._topic, self.cfg.kafka.partitions)
        consumer = KafkaConsumer(
            bootstrap_servers=self.cfg.kafka.bootstrap_servers,
            group_id=self.cfg.kafka.consumer_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=5000,
            fetch_max_bytes=16 * 1024 * 1024,
            **CONSUMER_TIMEOUTS,
        )
        consumer.subscribe([self._topic], listener=_SeekToManifest(self))
        return consumer

    def _restore_from_disk(self) -> None:
        root = Path(self.cfg.paths.data_root) / "passes"
        if root.is_dir():
            for day in root.iterdir():
                if day.is_dir() and (n := remove_stale_temps(day)):
                    log.warning("removed %d half-written pass directories under %s", n, day)
        done = complete_passes(self.cfg.paths.data_root)
        if not done:
            return
        last = read_manifest(pass_dir(self.cfg.paths.data_root, done[-1]))
        self._closed_through = last.pass_id
        self._replay_to = {int(p): o for p, o in last.consumed_to.get(self._topic, {}).items()}
        self._resume = {int(p): o for p, o in last.resume_offsets.get(self._topic, {}).items()}
        self._consumed_to = dict(self._replay_to)
        log.info("resuming after pass %s from offsets %s", last.pass_id, self._resume)

    def seek_assigned(self, assigned: Any) -> None:
        """Position newly assigned partitions at the newest manifest's resume offsets."""
        now = time.monotonic()
        for tp in assigned:
            self._partition_seen.setdefault(tp.partition, now)
            if tp.partition in self._resume:
                self._consumer.seek(tp, self._resume[tp.partition])

    @property
    def closed_through(self) -> str | None:
        """The newest pass written."""
        return self._closed_through

    def _ingest(self, partition: int, offset: int, value: bytes | None) -> None:
        replay = offset < self._replay_to.get(partition, -1)
        try:
            row = parse_event(value, self.cfg.feature_schema, self.cfg.kafka.max_message_bytes)
        except MalformedEvent as e:
            if not replay:
                self.malformed[e.reason] += 1
                log.debug("malformed event at %s/%d@%d: %s", self._topic, partition, offset, e)
            return
        pass_id = compose_pass_id(row["event_time_ms"], self.cfg.passes.pass_minutes)
        if self._closed_through is not None and pass_id <= self._closed_through:
            if not replay:
                self._late += 1
            return
        row["kafka_partition"] = partition
        row["kafka_offset"] = offset
        self._open.setdefault(pass_id, []).append(row)
        if row["event_time_ms"] > self._partition_max.get(partition, 0):
            self._partition_max[partition] = row["event_time_ms"]

    def watermark_ms(self, now: float | None = None) -> int:
        """Event time up to which every window is complete.

        The minimum of the partitions' newest event times, so a partition that is read
        later than another cannot have its events declared late. A partition without news
        for ``idle_partition_seconds`` (or never heard from since assignment) is left out
        once idle; if every partition is idle, the newest event time of all is used."""
        now = time.monotonic() if now is None else now
        idle_s = self.cfg.passes.idle_partition_seconds
        active = [
            self._partition_max.get(p, 0)
            for p, seen in self._partition_seen.items()
            if now - seen < idle_s
        ]
        # min() is 0 while an active partition has sent nothing yet: wait for it.
        newest = min(active) if active else max(self._partition_max.values(), default=0)
        return newest - self._lateness_ms

    def _resume_offsets(self) -> dict[int, int]:
        resume = dict(self._consumed_to)
        for rows in self._open.values():
            for row in rows:
                p = row["kafka_partition"]
                resume[p] = min(resume.get(p, row["kafka_offset"]), row["kafka_offset"])
        return resume

    def _close(self, pass_id: str) -> PassManifest:
        rows = self._open.pop(pass_id, [])
        table = pa.Table.from_pylist(rows, schema=self._arrow_schema)
        resume = self._resume_offsets()
        manifest = write_pass(
            self.cfg,
            pass_id,
            table,
            {
                "offsets": {self._topic: _offset_ranges(table)},
                "resume_offsets": {self._topic: {str(p): o for p, o in sorted(resume.items())}},
                "consumed_to": {
                    self._topic: {str(p): o for p, o in sorted(self._consumed_to.items())}
                },
                "malformed": sum(self.malformed.values()),
                "late": self._late,
            },
        )
        self._consumer.commit(
            {
                TopicPartition(self._topic, p): OffsetAndMetadata(o, "", -1)
                for p, o in resume.items()
            }
        )
        self._closed_through = pass_id
        self._resume = resume
        self.malformed.clear()
        self._late = 0
        log.info(
            "pass %s written: %d rows in %d parts (malformed %d, late %d)",
            pass_id,
            manifest.rows,
            len(manifest.parts),
            manifest.malformed,
            manifest.late,
        )
        return manifest

    def _close_ready(self, limit: int | None) -> list[PassManifest]:
        """Write up to ``limit`` complete windows, oldest first; an empty window between
        two written ones becomes an empty pass, so pass ids have no gaps."""
        watermark = self.watermark_ms()
        minutes = self.cfg.passes.pass_minutes
        newest_ready = max(
            (p for p in self._open if window_ms(p, minutes)[1] <= watermark), default=None
        )
        written: list[PassManifest] = []
        while newest_ready is not None and (limit is None or len(written) < limit):
            if self._closed_through is None:
                pass_id = min(self._open)
            else:
                pass_id = next_pass_id(self._closed_through, minutes)
            written.append(self._close(pass_id))
            if pass_id == newest_ready:
                break
        return written

    def run(
        self,
        max_passes: int | None = None,
        idle_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> list[PassManifest]:
        """Consume and write passes until ``max_passes`` are written, the topic stays idle
        for ``idle_timeout_s``, or ``stop`` is set. Returns the manifests written."""
        written: list[PassManifest] = []
        last_data = time.monotonic()
        while not (stop and stop.is_set()):
            records = self._consumer.poll(timeout_ms=500)
            now = time.monotonic()
            if not records:
                if idle_timeout_s is not None and now - last_data > idle_timeout_s:
                    break
            else:
                last_data = now
            for tp, messages in records.items():
                for m in messages:
                    self._ingest(tp.partition, m.offset, m.value)
                self._consumed_to[tp.partition] = messages[-1].offset + 1
                self._partition_seen[tp.partition] = now
            written += self._close_ready(None if max_passes is None else max_passes - len(written))
            if max_passes is not None and len(written) >= max_passes:
                break
        return written

    def close(self) -> None:
        self._consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cut the impressions topic into passes.")
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML")
    parser.add_argument("--max-passes", type=int, help="stop after writing this many passes")
    parser.add_argument("--idle-timeout", type=float, help="stop after this many idle seconds")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        builder = PassBuilder(load_config(args.config))
        try:
            builder.run(max_passes=args.max_passes, idle_timeout_s=args.idle_timeout)
        finally:
            builder.close()
    except StreamrecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
