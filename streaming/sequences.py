"""The one rule that cuts a ``pooling: sequence`` slot to its ``max_length``: the newest
keys (``keep: last``, for a history listed oldest first) or the first ones. The pipe reader
cuts a pass's column with it, serving an event's list, so both see the same keys."""

from __future__ import annotations

from typing import Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

T = TypeVar("T")
Keep = Literal["last", "first"]


def cut_list(values: list[T], max_length: int, keep: Keep) -> list[T]:
    """``values`` cut to at most ``max_length``, keeping the ``keep`` end."""
    if len(values) <= max_length:
        return values
    return values[-max_length:] if keep == "last" else values[:max_length]


def cut_lists(column: pa.Array, max_length: int, keep: Keep) -> pa.ListArray:
    """Every list of ``column`` cut as ``cut_list`` cuts one (a null list becomes empty)."""
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    if len(lengths) == 0 or lengths.max() <= max_length:
        return column
    flat = pc.list_flatten(column)
    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    position = np.arange(len(flat)) - starts[parents]
    kept = position >= lengths[parents] - max_length if keep == "last" else position < max_length
    offsets = np.concatenate([[0], np.cumsum(np.minimum(lengths, max_length))])
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), flat.filter(pa.array(kept)), type=column.type
    )
