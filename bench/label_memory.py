"""Memory of impressions waiting for their labels, held in memory against spilled to disk
past ``passes.join_memory_mib``; what a restart from the spill costs; and the join's speed
with spilling on against it off, in the same run.

    .venv/bin/python bench/label_memory.py [--rows 36000000] [--speed-rows 2000000]

The two-label pipeline (``examples/conversions``, after_window) holds every impression
until its one-hour conversion window closes: at 10,000 impressions a second, 36 million
rows. Rows are the builder's own: a chunk of 50,000 synthetic events encoded and decoded
as the builder does (``decode_impression_batch``), each further chunk a copy with new
event ids, times (an hour, spread evenly) and offsets, fed to one partition's join
(``PartitionJoin``) as the builder does, a checkpoint whenever it is past its budget.

1. Held in memory (spill off): the resident memory one million rows add (the process's
   RSS, with Arrow's unused pool memory released), and Arrow's own allocation (the rows'
   columns: the least they need).
2. Spilled (the default budget of 1 GiB for the partition): the RSS the process grows by
   while ``--rows`` rows wait, its peak after any chunk and at the end, and the disk the
   store takes; then the join is dropped and a new one restores it from the spill store,
   timed (what a restart costs instead of replaying the hour).
3. Speed: ``--speed-rows`` impressions over two hours with clicks (one in ten, within the
   click window) and conversions (one click in five), windows cut as the time passes,
   through a join with spilling off and with a 64 MiB budget; both must write the same
   rows and count the same labels.

Ends with ``RESULT waiting_rss_mib_<n>m`` (spilled, at the end; ``_peak``), its baseline
``waiting_rss_mib_<n>m_baseline`` (the in-memory cost per million, times n),
``waiting_mib_per_million`` (in memory) and its Arrow baseline, ``spill_restore_s``,
``join_rows_per_s_spill`` and ``join_rows_per_s_baseline`` (spill off).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from machine import hardware_line

from streaming.emit_plan import joined_labels, plan_of
from streaming.events import decode_impression_batch
from streaming.join import PartitionJoin
from streaming.join_spill import SpillSettings
from streaming.synthetic import SyntheticStream
from streaming.windows import WindowCutter
from streamrec.config import PipelineConfig, load_config

REPO = Path(__file__).resolve().parent.parent
CHUNK = 50_000
MIB = 1 << 20
START_MS = 1_767_225_600_000
HOUR_MS = 3_600_000


def _rss() -> int:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) * 1024


def _released_rss() -> int:
    gc.collect()
    pa.default_memory_pool().release_unused()
    return _rss()


def _template(cfg: PipelineConfig) -> pa.Table:
    """One chunk of the builder's decoded rows."""
    stream = SyntheticStream(cfg.feature_schema, cfg.synthetic)
    batch = stream.batch(START_MS, START_MS + HOUR_MS, CHUNK)
    values = [json.dumps(e).encode() for e in batch.events]
    table = decode_impression_batch(
        values, list(range(CHUNK)), 0, cfg.feature_schema, 1 << 20, carried=()
    )
    assert table is not None, "the synthetic events must decode column-wise"
    return table


def _chunk(template: pa.Table, first: int, times: np.ndarray) -> pa.Table:
    """``template`` as rows ``first`` on: new event ids, ``times`` and offsets."""
    n = len(times)
    ids = pa.array([f"bench-{i}" for i in range(first, first + n)])
    table = template.take(np.arange(n))  # buffers of its own, as a decoded batch has
    for name, array in (
        ("event_id", ids),
        ("event_time_ms", pa.array(times, pa.int64())),
        ("kafka_offset", pa.array(np.arange(first, first + n), pa.int64())),
    ):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), array)
    return table


def _join(cfg: PipelineConfig, spill: SpillSettings | None) -> PartitionJoin:
    return PartitionJoin(
        labels=joined_labels(cfg.labels),
        closed_through=None,
        replay_to={},
        plan=plan_of(cfg),
        clock=cfg.passes.clock,
        spill=spill,
    )


def _hold(cfg: PipelineConfig, template: pa.Table, rows: int, join: PartitionJoin) -> int:
    """Feed ``rows`` impressions of one hour into ``join``, checkpointing it whenever it is
    past its budget; the peak RSS after any chunk."""
    cutter = WindowCutter(cfg.passes.clock)
    peak = 0
    for first in range(0, rows, CHUNK):
        n = min(CHUNK, rows - first)
        times = START_MS + np.arange(first, first + n, dtype=np.int64) * HOUR_MS // rows
        table = _chunk(template, first, times)
        join.add_impressions(cutter.pass_ids_of(times), table)
        if join.over_budget():
            join.checkpoint({"impressions": first + n}, {})
        peak = max(peak, _rss())
    return peak


def _in_memory(cfg: PipelineConfig, template: pa.Table) -> tuple[float, float]:
    """MiB per million rows held in memory: the process's, and Arrow's."""
    rss0, arrow0 = _released_rss(), pa.total_allocated_bytes()
    join = _join(cfg, None)
    _hold(cfg, template, 1_000_000, join)
    rss, arrow = _released_rss() - rss0, pa.total_allocated_bytes() - arrow0
    assert join.waiting() == 1_000_000
    del join
    return rss / MIB, arrow / MIB


def _spilled(
    cfg: PipelineConfig, template: pa.Table, rows: int, budget_mib: int, root: Path
) -> dict[str, float]:
    spill = SpillSettings(root / "spill", budget_mib, "bench")
    rss0 = _released_rss()
    join = _join(cfg, spill)
    t = time.perf_counter()
    peak = _hold(cfg, template, rows, join)
    hold_s = time.perf_counter() - t
    assert join.waiting() == rows and join.spilled, "the rows must outgrow the budget"
    rss = _released_rss() - rss0
    join.checkpoint({"impressions": rows}, {})  # as after a cut: all of it restorable
    join.close_store()
    disk = sum(f.stat().st_size for f in spill.path.rglob("*") if f.is_file())
    del join
    gc.collect()
    t = time.perf_counter()
    restored = _join(cfg, spill)
    assert restored.restore() is not None and restored.waiting() == rows
    restore_s = time.perf_counter() - t
    restored.close_store()
    shutil.rmtree(spill.path)
    return {
        "hold_s": hold_s,
        "rss_mib": rss / MIB,
        "peak_mib": (peak - rss0) / MIB,
        "disk_mib": disk / MIB,
        "restore_s": restore_s,
    }


def _labelled(rows: int, seed: int = 58) -> tuple[np.ndarray, list[tuple[int, str, str, int]]]:
    """Impression times over two hours and their label events (time, kind, id, offset),
    clicks within a minute or so, conversions within the hour, in time order."""
    rng = np.random.default_rng(seed)
    times = START_MS + np.sort(rng.integers(0, 2 * HOUR_MS, rows))
    events = []
    clicked = np.flatnonzero(rng.random(rows) < 0.1)
    for i, delay in zip(clicked, rng.exponential(60_000, len(clicked)), strict=True):
        events.append((int(times[i] + delay), "click", f"bench-{i}"))
    converted = clicked[rng.random(len(clicked)) < 0.2]
    for i, delay in zip(converted, rng.lognormal(13.3, 1.5, len(converted)), strict=True):
        events.append((int(times[i] + delay), "conversion", f"bench-{i}"))
    events.sort()
    offsets: Counter[str] = Counter()
    labelled = []
    for t, kind, event_id in events:
        labelled.append((t, kind, event_id, offsets[kind]))
        offsets[kind] += 1
    return times, labelled


def _speed(
    cfg: PipelineConfig, template: pa.Table, rows: int, spill: SpillSettings | None
) -> tuple[float, int, dict[str, int]]:
    """Rows/s of a join fed ``rows`` impressions and their labels in time order, each
    window cut once the time passed its horizon; rows written and labels counted."""
    times, labels = _labelled(rows)
    join = _join(cfg, spill)
    cutter = WindowCutter(cfg.passes.clock, join.plan.cut_delay_ms)
    written, counts, next_label = 0, Counter[str](), 0
    window = cutter.pass_id_of(int(times[0]))
    t = time.perf_counter()
    for first in range(0, rows + CHUNK, CHUNK):
        chunk_times = times[first : first + CHUNK]
        now = int(chunk_times[-1]) if len(chunk_times) else int(times[-1]) + 2 * HOUR_MS
        while next_label < len(labels) and labels[next_label][0] <= now:
            at, kind, event_id, offset = labels[next_label]
            join.add_label(kind, event_id, at, offset)
            next_label += 1
        if len(chunk_times):
            join.add_impressions(
                cutter.pass_ids_of(chunk_times), _chunk(template, first, chunk_times)
            )
        while cutter.is_complete(window, now):
            table = join.close(window)
            written += table.num_rows if table is not None else 0
            for kind, c in join.take_counters().labels.items():
                counts.update({f"{kind}.{k}": v for k, v in vars(c).items()})
            window = cfg.passes.clock.next(window)
        if spill is not None and join.over_budget():
            join.checkpoint({}, {})
    elapsed = time.perf_counter() - t
    assert join.waiting() == 0, "every row is written by the end"
    join.close_store()
    return rows / elapsed, written, dict(counts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=36_000_000)
    parser.add_argument("--speed-rows", type=int, default=2_000_000)
    parser.add_argument(
        "--budget-mib", type=int, help="the spilled run's budget (passes.join_memory_mib)"
    )
    args = parser.parse_args()
    print(hardware_line())
    cfg = load_config(REPO / "examples/conversions/pipeline.yaml")
    template = _template(cfg)
    per_million, arrow = _in_memory(cfg, template)
    print(f"held in memory: {per_million:,.0f} MiB per million rows (Arrow's columns {arrow:,.0f})")
    millions = args.rows / 1_000_000
    with tempfile.TemporaryDirectory(prefix="label-memory-", dir="/var/tmp") as tmp:
        budget = args.budget_mib or cfg.passes.join_memory_mib or 1024
        spilled = _spilled(cfg, template, args.rows, budget, Path(tmp))
        print(
            f"{args.rows:,} rows spilled past {budget} MiB in "
            f"{spilled['hold_s']:,.0f} s: RSS grew {spilled['rss_mib']:,.0f} MiB (peak "
            f"{spilled['peak_mib']:,.0f}), {spilled['disk_mib']:,.0f} MiB on disk; held in "
            f"memory they would take about {per_million * millions:,.0f} MiB"
        )
        print(f"a restart restores them from the store in {spilled['restore_s']:.2f} s")
        speed = {}
        for name, spill in (
            ("baseline", None),
            ("spill", SpillSettings(Path(tmp) / "speed", 64, "bench")),
        ):
            speed[name] = _speed(cfg, template, args.speed_rows, spill)
            rate, written, counts = speed[name]
            print(
                f"join, spill {'off' if spill is None else 'on (64 MiB)'}: {rate:,.0f} rows/s, "
                f"{written:,} rows written, labels {counts}"
            )
    assert speed["spill"][1:] == speed["baseline"][1:], "both sides write the same rows"
    name = f"{millions:g}m"
    print(f"RESULT waiting_rss_mib_{name} {spilled['rss_mib']:.0f}")
    print(f"RESULT waiting_rss_mib_{name}_peak {spilled['peak_mib']:.0f}")
    print(f"RESULT waiting_rss_mib_{name}_baseline {per_million * millions:.0f}")
    print(f"RESULT waiting_mib_per_million {per_million:.0f}")
    print(f"RESULT waiting_mib_per_million_baseline {arrow:.0f}")
    print(f"RESULT spill_restore_s {spilled['restore_s']:.2f}")
    print(f"RESULT join_rows_per_s_spill {speed['spill'][0]:.0f}")
    print(f"RESULT join_rows_per_s_baseline {speed['baseline'][0]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
