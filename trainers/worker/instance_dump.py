"""Per-instance dumps of predictions and labels: exact metrics with several reader threads.

Paddle's reader threads update the graph's metric accumulators without a lock, so with
more than one thread a pass's counts come out short. The device workers can instead write
every instance's fields (``dump_fields`` in the program's fleet options) through their
dump threads, one ``part-<rank>-<n>`` file each, a line per instance:
``\\t<field>:<len>:<value>...`` per field. Reading them back gives every scored instance
exactly once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv


def point_dump(program: Any, fields: list[str], directory: Path | None) -> None:
    """Make the next dataset runs of ``program`` dump ``fields`` of every instance into an
    emptied ``directory``; ``None``: no dump."""
    options = program._fleet_opt
    if directory is None:
        options.pop("dump_fields", None)
        options.pop("dump_fields_path", None)
        return
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    options["dump_fields"] = list(fields)
    options["dump_fields_path"] = str(directory)


def read_dump(directory: Path, fields: int) -> list[np.ndarray]:
    """The dumped values (float64), one array per field in dump order, from every file of a
    run; each field must hold one value per instance."""
    return _read(directory, fields, ["_"])[1]


def read_dump_with_ids(directory: Path, fields: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The instance ids and ``read_dump``'s arrays of a run whose dataset parsed instance
    ids (a line then starts ``<ins_id>\t<ins_content>``). The dump threads write in no
    fixed order, so the ids are what pairs a value with its row."""
    return _read(directory, fields, ["id", "content"])


def _read(directory: Path, fields: int, head: list[str]) -> tuple[np.ndarray, list[np.ndarray]]:
    ids: list[np.ndarray] = []
    columns: list[list[np.ndarray]] = [[] for _ in range(fields)]
    names = [f"f{i}" for i in range(fields)]
    for part in sorted(Path(directory).glob("part-*")):
        if part.stat().st_size == 0:  # a dump thread that got no batch
            continue
        table = pacsv.read_csv(
            part,
            read_options=pacsv.ReadOptions(column_names=[*head, *names]),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in [*head, *names]},
                strings_can_be_null=False,
            ),
        )
        ids.append(table.column(head[0]).to_numpy(zero_copy_only=False))
        for i in range(fields):
            parts = pc.split_pattern(table.column(f"f{i}"), ":")  # name, length, value
            if not pc.all(pc.equal(pc.list_value_length(parts), 3)).as_py():
                raise ValueError(f"{part}: field {i} is not one value per instance")
            values = pc.cast(pc.list_element(parts, 2), pa.float64())
            columns[i].append(values.to_numpy(zero_copy_only=False))
    return (
        np.concatenate(ids) if ids else np.empty(0, dtype=object),
        [np.concatenate(c) if c else np.empty(0) for c in columns],
    )
