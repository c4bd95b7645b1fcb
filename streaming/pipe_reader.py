"""``pipe_command`` for Paddle's datasets: a Parquet pass part on stdin, MultiSlot text out.

Paddle runs ``cat <part> | <pipe_command>`` per file (per reader thread) and parses, for
each ``use_var`` in order, ``<n> v1 ... vn``. Our order (``slot_order``) is every sparse slot
(feature signs), then ``dense`` (all dense features), then each label (``label``, then
``label_<name>`` for the schema's further labels), then, with a label written before its
window closes, each row's kinds and delays (``SchemaConfig.row_columns``, read as floats).
The text is built column-wise with Arrow compute, each distinct value's text once, and
written straight from the result's data buffer: no Python loop per row. The process starts
lean: the slot layout comes as JSON on the command line (no YAML, no pydantic) and paddle is
never imported (it would cost about a second per file). Training, which reads each part up
to three times (scores, training, the intercept's refit), converts each part once to a local
text file (``convert_file``) and reads that with ``cat`` or ``awk`` (``text_command``): the reader
process costs 0.25 s to start, as much as a small pass's whole read.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streaming.feature_signs import signs_of
from streaming.sequences import Keep, cut_lists

if TYPE_CHECKING:
    from streamrec.config import SchemaConfig

DENSE_VAR = "dense"
LABEL_VAR = "label"
ROW_VAR = "row_index"  # fresh labels: <file number> << 32 | <row>, to find a scored row again
ROW_FILE_SHIFT = 32


@dataclass(frozen=True)
class ReaderLayout:
    """What the reader needs of the feature schema: slots (name, multi, default, for a
    sequence its max_length and which end it keeps (0 and "" otherwise), the slot its
    values are hashed as), dense, the label columns."""

    sparse: tuple[tuple[str, bool, str, int, Keep | Literal[""], str], ...]
    dense: tuple[str, ...]
    labels: tuple[str, ...] = (LABEL_VAR,)
    rows: tuple[str, ...] = ()  # fresh labels: each row's kinds and delays, as floats
    row_index: bool = False  # fresh labels: each row's index (``ROW_VAR``) last

    @classmethod
    def from_schema(cls, schema: SchemaConfig) -> ReaderLayout:
        return cls(
            tuple(
                (
                    s.name,
                    s.multi,
                    s.default,
                    s.max_length or 0,
                    s.keep if s.max_length else "",
                    s.key_slot,
                )
                for s in schema.sparse
            ),
            tuple(d.name for d in schema.dense),
            tuple(schema.label_columns),
            tuple(schema.row_columns),
            bool(schema.fresh_labels),
        )

    def to_arg(self) -> str:
        layout: dict[str, Any] = {"sparse": self.sparse, "dense": self.dense}
        layout["labels"] = self.labels
        layout |= {"rows": self.rows, "row_index": self.row_index}
        return json.dumps(layout, separators=(",", ":"))

    @classmethod
    def from_arg(cls, arg: str) -> ReaderLayout:
        raw = json.loads(arg)
        return cls(
            tuple((n, bool(m), d, int(ln), k, ks) for n, m, d, ln, k, ks in raw["sparse"]),
            tuple(raw["dense"]),
            tuple(raw["labels"]),
            tuple(raw["rows"]),
            bool(raw["row_index"]),
        )


def slot_order(schema: SchemaConfig) -> list[str]:
    """Names of the use_vars, in the order the text carries them."""
    dense = [DENSE_VAR] if schema.dense else []
    index = [ROW_VAR] if schema.fresh_labels else []
    return (
        [s.name for s in schema.sparse] + dense + schema.label_columns + schema.row_columns + index
    )


def _sign_text(slot: str, values: pa.Array, prefix: str = "") -> pa.Array:
    """``prefix + str(sign)`` of every value: computed per distinct value, then gathered."""
    encoded = pc.dictionary_encode(values)
    unique = pa.array(signs_of(slot, encoded.dictionary), type=pa.uint64()).cast(pa.string())
    if prefix:
        unique = pc.binary_join_element_wise(prefix, unique, "")
    return unique.take(encoded.indices)


# Paddle splits an instance id at whitespace: escape it (and the escape character) in ids
_ID_ESCAPES = [
    ("%", "%25"),
    (" ", "%20"),
    ("\t", "%09"),
    ("\n", "%0A"),
    ("\r", "%0D"),
    ("\x0b", "%0B"),
    ("\x0c", "%0C"),
]


def instance_ids(event_ids: pa.Array) -> pa.Array:
    """The instance id Paddle carries for each event id (``urllib.parse.unquote`` inverts
    it): whitespace-free, so it survives Paddle's parsing and its dumps."""
    for char, escape in _ID_ESCAPES:
        event_ids = pc.replace_substring(event_ids, char, escape)
    return event_ids


def multislot_text(
    table: pa.Table,
    layout: ReaderLayout | SchemaConfig,
    ins_id: bool = False,
    row_index: np.ndarray | None = None,
) -> bytes:
    """The MultiSlot text of ``table`` (pass columns), one line per row; with ``ins_id``
    each line starts with ``1 <instance id>`` (datasets that ``set_parse_ins_id``); a
    layout with a row index ends each line with ``1 <its row_index>`` (default: its row)."""
    return multislot_buffer(table, layout, ins_id, row_index).to_pybytes()


def multislot_buffer(
    table: pa.Table,
    layout: ReaderLayout | SchemaConfig,
    ins_id: bool = False,
    row_index: np.ndarray | None = None,
) -> pa.Buffer:
    """``multislot_text`` in Arrow's own buffer, not copied: a 100,000-row part's text is
    15 MB, and copying it twice cost 3-20 ms of its 0.09-0.13 s conversion."""
    if not isinstance(layout, ReaderLayout):
        layout = ReaderLayout.from_schema(layout)
    n = table.num_rows
    if n == 0:
        return pa.py_buffer(b"")
    columns: list[pa.Array | str] = []
    if ins_id:
        columns += ["1", instance_ids(table["event_id"].combine_chunks())]
    for name, multi, default, max_length, keep, key_slot in layout.sparse:
        col = table[name].combine_chunks()
        if multi:
            if max_length and keep:  # a sequence: what the network sees, as serving cuts it
                col = cut_lists(col, max_length, keep)
            lengths = pc.list_value_length(col).fill_null(0)
            if pc.min(lengths).as_py() == 0:  # an empty slot is illegal in MultiSlot: pad
                col = pc.if_else(pc.equal(lengths, 0), pa.scalar([default], col.type), col)
                lengths = pc.list_value_length(col)
            signs = pa.ListArray.from_arrays(
                col.offsets, _sign_text(key_slot, pc.list_flatten(col))
            )
            columns += [lengths.cast(pa.string()), pc.binary_join(signs, " ")]
        else:
            columns.append(_sign_text(key_slot, col, prefix="1 "))
    if layout.dense:
        columns.append(str(len(layout.dense)))
        columns += [table[d].combine_chunks().cast(pa.string()) for d in layout.dense]
    for label in layout.labels:
        columns += ["1", table[label].combine_chunks().cast(pa.string())]
    for column in layout.rows:
        columns += ["1", table[column].combine_chunks().cast(pa.string())]
    if layout.row_index:
        index = np.arange(n) if row_index is None else row_index
        columns += ["1", pa.array(index, pa.int64()).cast(pa.string())]
    columns.append("\n")
    lines = pc.binary_join_element_wise(*columns[:-1], " ")
    lines = pc.binary_join_element_wise(lines, "\n", "").cast(pa.large_string())
    _, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[lines.offset : lines.offset + n + 1]
    return data.slice(int(bounds[0]), int(bounds[-1] - bounds[0]))


def convert(
    source: BinaryIO,
    sink: BinaryIO,
    layout: ReaderLayout | SchemaConfig,
    ins_id: bool = False,
    every: int = 1,
    row_base: int = 0,
) -> int:
    """Read one Parquet file from ``source``, write the MultiSlot text of every ``every``-th
    row (the first, then each ``every`` rows on) to ``sink``; the rows written. A row index
    counts the file's rows from ``row_base``, sampled or not."""
    # one thread: a pass is read file by file in parallel already, and Arrow's reader
    # threads can abort a short-lived reader process at exit (apache/arrow#34314)
    table = pq.read_table(pa.BufferReader(source.read()), use_threads=False)
    rows = np.arange(0, table.num_rows, max(every, 1))
    if every > 1:
        table = table.take(rows)
    sink.write(multislot_buffer(table, layout, ins_id, row_base + rows))
    return table.num_rows


def convert_file(
    source: Path, target: Path, layout: ReaderLayout | SchemaConfig, row_base: int = 0
) -> int:
    """Write the MultiSlot text of the Parquet file ``source`` to ``target``: a pass part
    converted once, for several reads of it with ``text_command`` (whose samples keep each
    row's index); the rows written."""
    with open(source, "rb") as src, open(target, "wb") as sink:
        return convert(src, sink, layout, row_base=row_base)


def text_command(every: int = 1) -> str:
    """The pipe command for a part already in MultiSlot text (``convert_file``): every
    line, or every ``every``-th from the first, as ``convert`` samples."""
    return "cat" if every <= 1 else f"awk 'NR % {every} == 1'"


def pipe_command(schema: SchemaConfig, ins_id: bool = False, every: int = 1) -> str:
    """The shell command Paddle runs for every file (``every``: keep every k-th row)."""
    arg = ReaderLayout.from_schema(schema).to_arg()
    command = f"{shlex.quote(sys.executable)} -m streaming.pipe_reader --layout {shlex.quote(arg)}"
    return command + (" --ins-id" if ins_id else "") + (f" --every {every}" if every > 1 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Parquet pass part on stdin -> MultiSlot text.")
    parser.add_argument("--layout", required=True, help="slot layout JSON (see pipe_command)")
    parser.add_argument("--ins-id", action="store_true", help="start lines with the event id")
    parser.add_argument("--every", type=int, default=1, help="keep every k-th row (a sample)")
    args = parser.parse_args(argv)
    layout = ReaderLayout.from_arg(args.layout)
    convert(sys.stdin.buffer, sys.stdout.buffer, layout, args.ins_id, args.every)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # everything is written: leave without the interpreter's teardown, where Arrow's thread
    # pools still abort a reader now and then ("terminate called without an active
    # exception", exit status 134: 2 in 300 reads beside two busy loops)
    os._exit(code)
