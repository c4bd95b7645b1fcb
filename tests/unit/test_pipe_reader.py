"""The pipe reader writes Paddle's MultiSlot text and never imports paddle."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from streaming.events import pass_table_schema
from streaming.feature_signs import feature_sign
from streaming.pipe_reader import (
    convert,
    convert_file,
    multislot_text,
    pipe_command,
    slot_order,
    text_command,
)
from streaming.sequences import cut_list
from streamrec.config import PipelineConfig, derived


def _table(cfg: PipelineConfig) -> pa.Table:
    rows = [
        {
            "event_id": "a",
            "event_time_ms": 1,
            "label": 1,
            "kafka_partition": 0,
            "kafka_offset": 0,
            "user_id": "u1",
            "item_id": "i1",
            "category": "c",
            "hour": "h1",
            "tags": ["t1", "t2"],
            "price": 0.5,
            "user_ctr": -1.25,
        },
        {
            "event_id": "b",
            "event_time_ms": 2,
            "label": 0,
            "kafka_partition": 0,
            "kafka_offset": 1,
            "user_id": "u2",
            "item_id": "i2",
            "category": "",
            "hour": "h2",
            "tags": [],
            "price": 0.0,
            "user_ctr": 3.0,
        },
    ]
    return pa.Table.from_pylist(rows, schema=pass_table_schema(cfg.feature_schema))


def test_text_matches_the_multislot_grammar(shipped_config: PipelineConfig) -> None:
    text = multislot_text(_table(shipped_config), shipped_config.feature_schema).decode()
    first, second = text.splitlines()
    s = feature_sign
    assert first == (
        f"1 {s('user_id', 'u1')} 1 {s('item_id', 'i1')} 1 {s('category', 'c')} "
        f"1 {s('hour', 'h1')} 2 {s('tags', 't1')} {s('tags', 't2')} 2 0.5 -1.25 1 1"
    )
    # an empty multi-valued slot is padded with the slot default: MultiSlot forbids empty slots
    assert f" 1 {s('tags', '')} 2 0 3 1 0" in second
    assert text.endswith("\n") and text.count("\n") == 2
    assert slot_order(shipped_config.feature_schema) == [
        "user_id",
        "item_id",
        "category",
        "hour",
        "tags",
        "dense",
        "label",
    ]


def test_convert_streams_parquet_to_text(shipped_config: PipelineConfig) -> None:
    buf = io.BytesIO()
    pq.write_table(_table(shipped_config), buf)
    out = io.BytesIO()
    assert convert(io.BytesIO(buf.getvalue()), out, shipped_config.feature_schema) == 2
    assert out.getvalue() == multislot_text(_table(shipped_config), shipped_config.feature_schema)


def test_every_kth_row_is_a_sample_through_the_command(
    shipped_config: PipelineConfig, tmp_path: Path
) -> None:
    schema = shipped_config.feature_schema
    table = pa.concat_tables([_table(shipped_config)] * 5)  # rows a, b, a, b, ... (10)
    table = table.set_column(0, "event_id", pa.array([f"e{i}" for i in range(10)]))
    pq.write_table(table, tmp_path / "part.parquet")
    cmd = f"cat {tmp_path / 'part.parquet'} | {pipe_command(schema, ins_id=True, every=3)}"
    out = subprocess.run(cmd, shell=True, capture_output=True, check=True).stdout
    assert [line.split()[1] for line in out.decode().splitlines()] == ["e0", "e3", "e6", "e9"]
    assert out == multislot_text(table.take([0, 3, 6, 9]), schema, ins_id=True)
    assert "--every" not in pipe_command(schema)


def test_a_part_converted_once_reads_as_the_parquet_reader_would(
    shipped_config: PipelineConfig, tmp_path: Path
) -> None:
    """Training converts each part to text once and reads it with ``text_command``: every
    read (whole, or every k-th row) gives the very bytes the Parquet reader gives."""
    schema = shipped_config.feature_schema
    table = pa.concat_tables([_table(shipped_config)] * 5)
    users = pa.array([f"u{i}" for i in range(10)])  # every row distinct
    table = table.set_column(table.schema.get_field_index("user_id"), "user_id", users)
    pq.write_table(table, tmp_path / "part.parquet")
    assert convert_file(tmp_path / "part.parquet", tmp_path / "part.txt", schema) == 10
    for every in (1, 2, 3, 4, 10, 11):
        text = f"cat {tmp_path / 'part.txt'} | {text_command(every)}"
        parquet = f"cat {tmp_path / 'part.parquet'} | {pipe_command(schema, every=every)}"
        got = subprocess.run(text, shell=True, capture_output=True, check=True).stdout
        want = subprocess.run(parquet, shell=True, capture_output=True, check=True).stdout
        assert got == want == multislot_text(table.take(list(range(0, 10, every))), schema), every


def test_pipe_command_runs_without_paddle(shipped_config: PipelineConfig, tmp_path: Path) -> None:
    pq.write_table(_table(shipped_config), tmp_path / "part.parquet")
    cmd = f"cat {tmp_path / 'part.parquet'} | {pipe_command(shipped_config.feature_schema)}"
    out = subprocess.run(cmd, shell=True, capture_output=True, check=True)
    assert out.stdout == multislot_text(_table(shipped_config), shipped_config.feature_schema)
    probe = f"""
import io, runpy, sys
sys.argv = ["pipe_reader"] + {shlex.split(pipe_command(shipped_config.feature_schema))[3:]!r}
sys.stdin = io.TextIOWrapper(open({str(tmp_path / "part.parquet")!r}, "rb"))
sys.stdout = io.TextIOWrapper(open("/dev/null", "wb"))
try:
    runpy.run_module("streaming.pipe_reader", run_name="__main__")
except SystemExit as e:
    assert e.code == 0, e.code
heavy = [m for m in ("paddle", "pydantic", "yaml", "kafka") if m in sys.modules]
assert not heavy, f"the pipe reader imported {{heavy}}"
"""
    subprocess.run([sys.executable, "-c", probe], check=True)
    argv = shlex.split(pipe_command(shipped_config.feature_schema))
    assert argv[:3] == [sys.executable, "-m", "streaming.pipe_reader"]


def test_instance_ids_survive_paddle_whitespace_splitting(shipped_config: PipelineConfig) -> None:
    table = _table(shipped_config)
    table = table.set_column(
        table.schema.get_field_index("event_id"),
        "event_id",
        pa.array(["a b%c\td"] + [f"id{i}" for i in range(1, table.num_rows)]),
    )
    lines = multislot_text(table, shipped_config.feature_schema, ins_id=True).decode().splitlines()
    plain = multislot_text(table, shipped_config.feature_schema).decode().splitlines()
    first = lines[0].split(" ")
    assert first[:2] == ["1", "a%20b%25c%09d"]
    assert unquote(first[1]) == "a b%c\td"
    assert [line.split(" ", 2)[2] for line in lines] == plain
    assert pipe_command(shipped_config.feature_schema, ins_id=True).endswith(" --ins-id")


def test_a_sequence_slot_is_cut_as_serving_cuts_it(
    shipped_config: PipelineConfig, tmp_path: Path
) -> None:
    """A ``pooling: sequence`` slot reaches training cut to ``max_length`` at the end it
    keeps, in the event's order, through the very pipe command Paddle runs; the rows are
    the ones ``streaming.sequences.cut_list`` (serving's rule) gives, hashed as the slot
    named by ``keys_of`` where there is one."""
    histories = [["t1", "t2", "t3", "t4"], ["t9"], []]
    for keep, shared in (("last", {}), ("first", {"keys_of": "item_id"})):
        key_slot = shared.get("keys_of", "tags")  # hashed as item_id: the same keys
        sparse = [
            {**s.model_dump(), "pooling": "sequence", "max_length": 2, "keep": keep, **shared}
            if s.name == "tags"
            else s.model_dump()
            for s in shipped_config.feature_schema.sparse
        ]
        schema = derived(shipped_config, "test", feature_schema={"sparse": sparse}).feature_schema
        table = pa.concat_tables([_table(shipped_config), _table(shipped_config)]).slice(0, 3)
        table = table.set_column(
            table.schema.get_field_index("tags"),
            "tags",
            pa.array(histories, table.schema.field("tags").type),
        )
        pq.write_table(table, tmp_path / "part.parquet")
        cmd = f"cat {tmp_path / 'part.parquet'} | {pipe_command(schema)}"
        out = subprocess.run(cmd, shell=True, capture_output=True, check=True).stdout
        order = slot_order(schema)
        for line, history in zip(out.decode().splitlines(), histories, strict=True):
            fields = line.split()
            at = 0
            for _ in order[: order.index("tags")]:
                at += 1 + int(fields[at])
            n = int(fields[at])
            kept = cut_list(history or [""], 2, keep)  # an empty list is the default's
            assert fields[at + 1 : at + 1 + n] == [str(feature_sign(key_slot, v)) for v in kept]
        assert cut_list(histories[0], 2, keep) == (["t3", "t4"] if keep == "last" else ["t1", "t2"])
