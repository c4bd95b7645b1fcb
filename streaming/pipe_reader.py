"""``pipe_command`` for Paddle's QueueDataset: a Parquet pass part on stdin, MultiSlot text out.

Paddle runs ``cat <part> | <pipe_command>`` per file and parses, for each ``use_var`` in
order, ``<n> v1 ... vn``. Our order (``slot_order``) is every sparse slot (feature signs),
then ``dense`` (all dense features), then ``label``. The text is built column-wise with
Arrow compute and written from the result's data buffer: no Python loop per row, and no
paddle import (it would cost about a second per file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streaming.feature_signs import signs_of
from streamrec.config import SchemaConfig, load_config

DENSE_VAR = "dense"
LABEL_VAR = "label"


def slot_order(schema: SchemaConfig) -> list[str]:
    """Names of the use_vars, in the order the text carries them."""
    return [s.name for s in schema.sparse] + ([DENSE_VAR] if schema.dense else []) + [LABEL_VAR]


def _u64_text(signs) -> pa.Array:
    return pa.array(signs, type=pa.uint64()).cast(pa.string())


def multislot_text(table: pa.Table, schema: SchemaConfig) -> bytes:
    """The MultiSlot text of ``table`` (pass columns), one line per row."""
    n = table.num_rows
    if n == 0:
        return b""
    columns: list[pa.Array] = []
    for slot in schema.sparse:
        col = table[slot.name].combine_chunks()
        if slot.multi:
            lengths = pc.list_value_length(col).fill_null(0)
            if pc.min(lengths).as_py() == 0:  # an empty slot is illegal in MultiSlot: pad
                col = pc.if_else(pc.equal(lengths, 0), pa.scalar([slot.default], col.type), col)
                lengths = pc.list_value_length(col)
            flat = pc.list_flatten(col)
            joined = pc.binary_join(
                pa.ListArray.from_arrays(col.offsets, _u64_text(signs_of(slot.name, flat))), " "
            )
            columns += [lengths.cast(pa.string()), joined]
        else:
            columns += [pa.array(["1"] * n), _u64_text(signs_of(slot.name, col))]
    if schema.dense:
        columns.append(pa.array([str(len(schema.dense))] * n))
        columns += [table[d.name].combine_chunks().cast(pa.string()) for d in schema.dense]
    columns += [pa.array(["1"] * n), table["label"].combine_chunks().cast(pa.string())]
    lines = pc.binary_join_element_wise(*columns, " ")
    lines = pc.binary_join_element_wise(lines, pa.array([""] * n), "\n").cast(pa.large_string())
    _, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[lines.offset : lines.offset + n + 1]
    return data.to_pybytes()[bounds[0] : bounds[-1]]


def convert(source: BinaryIO, sink: BinaryIO, schema: SchemaConfig) -> int:
    """Read one Parquet file from ``source``, write its MultiSlot text to ``sink``; row count."""
    table = pq.read_table(pa.BufferReader(source.read()))
    sink.write(multislot_text(table, schema))
    return table.num_rows


def pipe_command(config_path: Path) -> str:
    """The shell command Paddle runs for every file."""
    return f"{sys.executable} -m streaming.pipe_reader --config {config_path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Parquet pass part on stdin -> MultiSlot text.")
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML (for the schema)")
    args = parser.parse_args(argv)
    convert(sys.stdin.buffer, sys.stdout.buffer, load_config(args.config).feature_schema)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
