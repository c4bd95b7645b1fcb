"""Memory of impressions waiting for their labels: what a million rows held by the join
take, against the same rows' Arrow columns alone, in the same run.

    .venv/bin/python bench/label_memory.py [--rows 1000000]

The two-label pipeline (``examples/conversions``) holds every impression until its longest
window closes: an hour of traffic for a one-hour conversion window. Rows are generated,
encoded and decoded as the builder does (``decode_impression_batch``) in chunks of 50,000
into one partition's join (``PartitionJoin``), all in windows not yet cut. Measured: the
process's resident memory before and after (after a first decode, with the event dicts
freed and collected and Arrow's unused pool memory released), and
Arrow's own allocation (the rows' columns, the baseline: what the rows need at the least);
the difference is the join's index (event id -> window) and Python's overhead. Ends with
``RESULT waiting_mib_per_million`` and ``RESULT waiting_mib_per_million_baseline``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import pyarrow as pa
from machine import hardware_line

from streaming.emit_plan import joined_labels, plan_of
from streaming.events import decode_impression_batch
from streaming.join import PartitionJoin
from streaming.synthetic import SyntheticStream
from streaming.windows import WindowCutter
from streamrec.config import load_config

REPO = Path(__file__).resolve().parent.parent
CHUNK = 50_000
MIB = 1 << 20


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    print(hardware_line())
    cfg = load_config(REPO / "examples/conversions/pipeline.yaml")
    schema = cfg.feature_schema
    join = PartitionJoin(
        labels=joined_labels(cfg.labels),
        closed_through=None,
        replay_to={},
        plan=plan_of(cfg),
        pass_minutes=cfg.passes.pass_minutes,
    )
    stream = SyntheticStream(schema, cfg.synthetic)
    cutter = WindowCutter(cfg.passes.pass_minutes)
    start_ms, span_ms = 1_767_225_600_000, 3_600_000  # an hour of impressions
    warm = [json.dumps(e).encode() for e in stream.batch(0, 1, CHUNK).events]
    decode_impression_batch(warm, list(range(CHUNK)), 0, schema, 1 << 20, carried=())
    del warm  # the imports and kernels a first decode loads are not the rows' memory
    pool = pa.default_memory_pool()
    gc.collect()
    pool.release_unused()
    rss0, arrow0 = _rss(), pa.total_allocated_bytes()
    for first in range(0, args.rows, CHUNK):
        n = min(CHUNK, args.rows - first)
        a = start_ms + span_ms * first // args.rows
        b = start_ms + span_ms * (first + n) // args.rows
        batch = stream.batch(a, b, n)
        values = [json.dumps(e).encode() for e in batch.events]
        del batch
        table = decode_impression_batch(
            values, list(range(first, first + n)), 0, schema, 1 << 20, carried=()
        )
        assert table is not None, "the synthetic events must decode column-wise"
        join.add_impressions(cutter.pass_ids_of(table["event_time_ms"].to_numpy()), table)
        del values, table
    gc.collect()
    pool.release_unused()
    rss, arrow = _rss() - rss0, pa.total_allocated_bytes() - arrow0
    assert join.waiting() == args.rows
    per_million = 1_000_000 / args.rows / MIB
    print(f"rows waiting: {join.waiting():,} in {len(join.pending)} windows")
    print(f"resident memory grew {rss / MIB:,.0f} MiB; Arrow holds {arrow / MIB:,.0f} MiB")
    print(f"RESULT waiting_mib_per_million {rss * per_million:.0f}")
    print(f"RESULT waiting_mib_per_million_baseline {arrow * per_million:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
