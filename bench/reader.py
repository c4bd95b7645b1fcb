"""Rows/s of streamrec's pipe reader against a PaddleRec-style MultiSlotDataGenerator
reader on the same rows, both run as Paddle runs them: ``cat <file> | <command>``, one
process per file. Prints both figures, then ``RESULT reader_speedup <ours / reference>``.

    .venv/bin/python bench/reader.py [--rows 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from machine import hardware_line

from streaming.events import normalize_event, pass_table_schema
from streaming.pipe_reader import pipe_command
from streaming.synthetic import SyntheticStream
from streamrec.config import load_config

REPO = Path(__file__).resolve().parent.parent


def _time(shell: str, env: dict[str, str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    out = subprocess.run(shell, shell=True, check=True, capture_output=True, env=env).stdout
    return time.perf_counter() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="rows in the pass part")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each reader; the best counts"
    )
    args = parser.parse_args()

    cfg = load_config(REPO / "configs" / "pipeline.yaml")
    schema = cfg.feature_schema
    batch = SyntheticStream(schema, cfg.synthetic).batch(1767225600000, 1767226200000, args.rows)
    rows = []
    for i, event in enumerate(batch.events):
        row = normalize_event(event, schema)
        row["kafka_partition"], row["kafka_offset"] = 0, i
        rows.append(row)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        part = tmp_path / "part-00000.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=pass_table_schema(schema)), part)
        text = tmp_path / "part-00000.tsv"
        with open(text, "w") as f:
            for r in rows:
                sparse = [",".join(r[s.name]) if s.multi else r[s.name] for s in schema.sparse]
                dense = ",".join(repr(r[d.name]) for d in schema.dense)
                f.write("\t".join([str(r["label"]), dense, *sparse]) + "\n")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        slots = ",".join(s.name for s in schema.sparse)
        ours_cmd = f"cat {part} | {pipe_command(schema)}"
        ref_cmd = f"cat {text} | {sys.executable} {REPO / 'bench' / 'reference_reader.py'} {slots}"

        ours = [_time(ours_cmd, env) for _ in range(args.repeat)]
        ref = [_time(ref_cmd, env) for _ in range(args.repeat)]
        ours_lines, ref_lines = ours[0][1].count(b"\n"), ref[0][1].count(b"\n")
        if ours_lines != args.rows or ref_lines != args.rows:
            raise SystemExit(f"readers disagree: ours {ours_lines} lines, reference {ref_lines}")
        if [len(x.split()) for x in ours[0][1].splitlines()[:100]] != [
            len(x.split()) for x in ref[0][1].splitlines()[:100]
        ]:
            raise SystemExit("readers wrote different MultiSlot layouts")
        best_ours, best_ref = min(t for t, _ in ours), min(t for t, _ in ref)

    print(f"hardware: {hardware_line()}")
    print(f"rows per file: {args.rows:,}; best of {args.repeat} runs, process start included")
    for name, seconds in (
        ("streamrec pipe reader (Parquet, Arrow)", best_ours),
        ("reference MultiSlotDataGenerator (TSV)", best_ref),
    ):
        print(f"  {name:<40} {seconds:6.2f}s {args.rows / seconds:>12,.0f} rows/s")
    print(f"RESULT reader_speedup {best_ref / best_ours:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
