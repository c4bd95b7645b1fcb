"""How the cluster and serving grow with the sparse table: tables of 1M, 4M and 16M keys.

Passes whose first two sparse slots carry ids never seen before (two new keys a row) are
written with the pass builder's own slice writer and assembler (``streaming.slices``),
not through the broker: the table is what is measured here, and 8M events through the
embedded broker would take longer than everything else. The shipped cluster (1 server,
2 workers; eviction off, so no key leaves) trains them, one pass at a time, until the table
holds each size of ``--sizes``; then, at that size:

    server memory   the servers' RSS; per key, the slope between sizes
    full artifact   the model delivered as a version (a full one: the last size's
                    maintenance wrote a new base): its size on disk and Redis's used memory
                    for its embeddings, per key
    delta delivery  a pass that touches a tenth of the ids again (a fifth of the keys),
                    delivered as a delta: its export command, packaging and delivery (the
                    delta's embeddings written to Redis), per million keys in the delta
    base save       the daily maintenance (``maintain``): fleet.shrink, then the mode-3 save
                    of every key, per million keys
    serving memory  ``streamrec serve`` with the in-process store on the delivered version:
                    its RSS; per key, the slope between sizes
    restore         a new cluster started on the base just saved: start-up until every
                    worker is ready, less an empty cluster's start-up (measured first), per
                    million keys

Then the projection to 100M and 1B keys: memory, save and restore time, and hosts of this
machine's memory. Charts of every curve go to ``--out`` (one HTML file, no server needed).

    .venv/bin/python bench/scale.py [--sizes 1,4,16] [--rows-per-pass 1000000]

Ends with ``RESULT server_bytes_per_key``, ``RESULT base_save_s_per_million``,
``RESULT restore_s_per_million``, ``RESULT serving_bytes_per_key`` (each at the largest
size), ``RESULT redis_bytes_per_key`` and ``RESULT delta_delivery_s_per_million``.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from machine import hardware_line
from pipeline import bench_config, delivering_every_pass
from serving import Served

from devservices.local_services import local_services
from ops.charts import Series, YRange, chart_page, line_chart
from serving_export import delivery
from serving_export.manifest import ArtifactManifest
from streaming.events import pass_table_schema
from streaming.slices import assemble_pass, write_slice
from streamrec.config import PipelineConfig, dump_config
from streamrec.contracts.training import TrainResult
from streamrec.passes import EventCounts, PartitionRange, pass_dir
from streamrec.redis_conn import connect
from trainers.launcher import LocalCluster

FIRST = "202601010000"
MIB = 2**20


@dataclass
class Point:
    """The figures at one table size."""

    keys: int
    server_rss: float  # bytes
    delta_keys: int
    delta_delivery_s: float
    shrink_s: float
    save_s: float
    artifact_bytes: int
    redis_bytes: int
    serving_rss: float  # bytes
    start_s: float  # a new cluster's start-up on the saves


def write_pass(cfg: PipelineConfig, pass_id: str, first_id: int, rows: int) -> None:
    """A pass of ``rows`` rows whose first two sparse slots hold ids from ``first_id`` on,
    each new; the other slots draw from a hundred values."""
    rng = np.random.default_rng(first_id)
    schema = pass_table_schema(cfg.feature_schema)
    ids = pa.array(np.arange(first_id, first_id + rows)).cast(pa.string())
    start_ms, end_ms = cfg.passes.clock.window(pass_id)
    fresh = [s.name for s in cfg.feature_schema.sparse][:2]
    columns: dict[str, pa.Array] = {
        "event_id": pc.binary_join_element_wise("e", ids, ""),
        "event_time_ms": pa.array(start_ms + np.arange(rows) % (end_ms - start_ms)),
        "label": pa.array((rng.random(rows) < 0.2).astype(np.int8)),
        "kafka_partition": pa.array(np.zeros(rows, dtype=np.int32)),
        "kafka_offset": pa.array(np.arange(rows)),
    }
    for slot in cfg.feature_schema.sparse:
        if slot.name in fresh:
            values = pc.binary_join_element_wise(slot.name, ids, "")
        else:
            values = pa.array(rng.integers(0, 100, rows)).cast(pa.string())
        columns[slot.name] = (
            pa.ListArray.from_arrays(np.arange(rows + 1, dtype=np.int32), values)
            if slot.multi
            else values
        )
    for dense in cfg.feature_schema.dense:
        columns[dense.name] = pa.array(rng.random(rows))
    table = pa.table({f.name: columns[f.name].cast(f.type) for f in schema}, schema=schema)
    topic = cfg.kafka.impressions_topic
    fields = {
        "offsets": {topic: PartitionRange(first=0, last=rows - 1, rows=rows)},
        "resume_offsets": {topic: rows},
        "consumed_to": {topic: rows},
        "counts": EventCounts(),
    }
    root, version = cfg.paths.data_root, cfg.feature_schema.version
    write_slice(root, version, pass_id, 0, table, cfg.passes.parts_per_pass, fields)
    assemble_pass(root, pass_id, 1, version, cfg.passes.clock)


def _rss(processes: list[psutil.Process]) -> float:
    return float(sum(p.memory_info().rss for p in processes))


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _timed_start(cfg: PipelineConfig, config: Path) -> tuple[LocalCluster, float]:
    cluster = LocalCluster(cfg, config)
    started = time.perf_counter()
    cluster.start()
    return cluster, time.perf_counter() - started


def _deliver(
    cfg: PipelineConfig, cluster: LocalCluster, trained: TrainResult
) -> tuple[ArtifactManifest, float]:
    """Export, package and deliver the pass just trained; its manifest and the seconds."""
    decision = delivery.evaluate(cfg, trained)
    started = time.perf_counter()
    raw = cluster.client.export(trained.pass_id).raw_export
    manifest = delivery.publish(cfg, raw, decision)
    delivery.deliver(cfg, manifest.version)
    return manifest, time.perf_counter() - started


def grow(cfg: PipelineConfig, config: Path, sizes: list[int], rows: int) -> list[Point]:
    """Train passes of new ids until the table holds each size; the figures at each."""
    cluster, empty_start = _timed_start(cfg, config)
    print(f"empty cluster ready in {empty_start:.1f} s", flush=True)
    r = connect(cfg.redis)
    points, keys, next_id, pass_id = [], 0, 0, FIRST

    def train(first_id: int, n: int) -> TrainResult:
        nonlocal pass_id
        write_pass(cfg, pass_id, first_id, n)
        started = time.perf_counter()
        trained = cluster.client.train(pass_id)
        print(
            f"  pass {pass_id}: {n:,} rows in {time.perf_counter() - started:.1f} s, "
            f"{trained.checkpoint.table_keys:,} keys",
            flush=True,
        )
        pass_id = cfg.passes.clock.next(pass_id)
        return trained

    try:
        for size in sizes:
            while keys < size:
                n = min(rows, math.ceil((size - keys) / 2))
                trained = train(next_id, n)
                next_id += n
                keys = trained.checkpoint.table_keys
            server_rss = _rss(cluster.members("PSERVER"))
            # the whole model as a version of its own (a new base since the last size's
            # maintenance): its size on disk and in Redis
            before = int(r.info("memory")["used_memory"])
            full, _ = _deliver(cfg, cluster, trained)
            redis_bytes = int(r.info("memory")["used_memory"]) - before
            if full.sparse.kind != "full":
                raise SystemExit(f"version {full.version} is a {full.sparse.kind}")
            artifact = _du(Path(cfg.paths.model_root) / cfg.model.model / full.version)
            # a pass touching a tenth of the ids again (a fifth of the keys), as a delta
            touched = train(0, max(1, keys // 10))
            delta, delta_s = _deliver(cfg, cluster, touched)
            maintained = cluster.client.maintain(touched.pass_id).seconds
            service = Served(config, "inprocess", "paddle", Path(cfg.paths.work_root) / "serve.log")
            try:
                serving_rss = _rss([psutil.Process(service.proc.pid)])
            finally:
                service.stop()
            cluster.stop()
            cluster, start_s = _timed_start(cfg, config)
            point = Point(
                keys,
                server_rss,
                delta.sparse.keys,
                delta_s,
                maintained["shrink"],
                maintained["save"],
                artifact,
                redis_bytes,
                serving_rss,
                start_s - empty_start,
            )
            points.append(point)
            print(
                f"{keys:,} keys: servers {server_rss / MIB:,.0f} MiB, full artifact "
                f"{artifact / MIB:,.0f} MiB and {redis_bytes / MIB:,.0f} MiB in Redis, a "
                f"{delta.sparse.kind} of {point.delta_keys:,} keys delivered in "
                f"{delta_s:.1f} s, shrink {point.shrink_s:.1f} s, base save "
                f"{point.save_s:.1f} s, restore {point.start_s:.1f} s, serving "
                f"{serving_rss / MIB:,.0f} MiB",
                flush=True,
            )
    finally:
        cluster.stop()
    return points


def _slope(points: list[Point], attr: str) -> float:
    """Bytes per key from the first size to the last (the fixed part drops out)."""
    a, b = points[0], points[-1]
    return (getattr(b, attr) - getattr(a, attr)) / (b.keys - a.keys)


def _saved_value_floats(cfg: PipelineConfig) -> int:
    """Floats in a key's value as the server saves it: one line of a saved shard."""
    for part in sorted(Path(cfg.paths.checkpoint_root).glob("*/*/part-*-*")):
        with open(part, "rb") as f:
            zipped = f.read(2) == b"\x1f\x8b"
        with gzip.open(part, "rt") if zipped else open(part) as f:
            line = f.readline().split()
        if line:
            return len(line) - 1  # the key
    raise SystemExit("no saved sparse line found under the checkpoints")


def report(cfg: PipelineConfig, points: list[Point], out: Path) -> None:
    rows = [
        (
            "keys",
            "servers B/key",
            "save s/M",
            "shrink s/M",
            "restore s/M",
            "delta s/M",
            "artifact B/key",
            "Redis B/key",
            "serving B/key",
        ),
    ]
    for p in points:
        m = p.keys / 1e6
        rows.append(
            (
                f"{p.keys:,}",
                f"{p.server_rss / p.keys:.0f}",
                f"{p.save_s / m:.2f}",
                f"{p.shrink_s / m:.2f}",
                f"{p.start_s / m:.2f}",
                f"{p.delta_delivery_s / (p.delta_keys / 1e6):.2f}",
                f"{p.artifact_bytes / p.keys:.0f}",
                f"{p.redis_bytes / p.keys:.0f}",
                f"{p.serving_rss / p.keys:.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    server, serving = _slope(points, "server_rss"), _slope(points, "serving_rss")
    value = 4 * _saved_value_floats(cfg)
    print(
        f"per key, slope from {points[0].keys:,} to {points[-1].keys:,} keys: servers "
        f"{server:.0f} B (a saved value is {value} B: {value // 4} floats), serving "
        f"in-process {serving:.0f} B"
    )
    last = points[-1]
    save, restore = last.save_s / (last.keys / 1e6), last.start_s / (last.keys / 1e6)
    host = psutil.virtual_memory().total
    for total in (100e6, 1e9):
        print(
            f"{total:,.0f} keys: servers {server * total / 2**30:,.0f} GiB "
            f"({math.ceil(server * total / (0.75 * host))} host(s) of {host / 2**30:.0f} GiB at "
            f"75% use), base save {save * total / 1e6 / 60:,.0f} min and restore "
            f"{restore * total / 1e6 / 60:,.0f} min on one server (they shard with servers), "
            f"serving in-process {serving * total / 2**30:,.0f} GiB a replica, Redis "
            f"{last.redis_bytes / last.keys * total / 2**30:,.0f} GiB"
        )
    x = [p.keys for p in points]

    def per_key(title: str, series: dict[str, list[float]], unit: str) -> str:
        return line_chart(
            title.split()[0].lower() + "-" + unit.replace("/", "-").replace(" ", ""),
            title,
            x,
            [Series(label, values) for label, values in series.items()],
            x_label="keys in the table",
            y_label=unit,
            y_range=YRange(floor=0.0),
            x_scale="log",
        )

    charts = [
        per_key(
            "Memory per key",
            {
                "servers": [p.server_rss / p.keys for p in points],
                "serving, in-process": [p.serving_rss / p.keys for p in points],
                "Redis": [p.redis_bytes / p.keys for p in points],
                "full artifact on disk": [p.artifact_bytes / p.keys for p in points],
            },
            "bytes per key",
        ),
        per_key(
            "Seconds per million keys",
            {
                "base save": [p.save_s / (p.keys / 1e6) for p in points],
                "shrink": [p.shrink_s / (p.keys / 1e6) for p in points],
                "restore": [p.start_s / (p.keys / 1e6) for p in points],
                "delta delivery (per M keys in the delta)": [
                    p.delta_delivery_s / (p.delta_keys / 1e6) for p in points
                ],
            },
            "seconds per million keys",
        ),
    ]
    out.write_text(
        chart_page("bench/scale.py: how the table's cost grows", charts, hardware_line())
    )
    print(f"charts: {out}")
    print(f"RESULT server_bytes_per_key {server:.1f}")
    print(f"RESULT base_save_s_per_million {save:.2f}")
    print(f"RESULT restore_s_per_million {restore:.2f}")
    print(f"RESULT serving_bytes_per_key {serving:.1f}")
    print(f"RESULT redis_bytes_per_key {last.redis_bytes / last.keys:.1f}")
    print(
        f"RESULT delta_delivery_s_per_million {last.delta_delivery_s / (last.delta_keys / 1e6):.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,4,16", help="table sizes, millions of keys")
    parser.add_argument("--rows-per-pass", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=Path("bench-scale.html"))
    args = parser.parse_args()
    sizes = [int(float(s) * 1e6) for s in args.sizes.split(",")]
    print(hardware_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(tmp)
        with local_services(root / "services") as services:
            cfg = bench_config(services, root, "scale")
            cfg = delivering_every_pass(cfg, base_every_passes=10_000)
            config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
            pass_dir(cfg.paths.data_root, FIRST).parent.mkdir(parents=True, exist_ok=True)
            points = grow(cfg, config, sizes, args.rows_per_pass)
            report(cfg, points, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
