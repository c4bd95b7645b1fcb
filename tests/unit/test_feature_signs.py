"""Feature signs: the vectorised hash equals the reference, and the contract is pinned."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, strategies as st

from streaming.feature_signs import feature_sign, signs_of, signs_of_values


def test_pinned_values_never_change() -> None:
    # Changing these breaks every saved table and artifact: bump SIGN_VERSION instead.
    assert feature_sign("user_id", "u1") == 10645647797545271773
    assert feature_sign("user_id", "") == 16755826307102860831
    assert feature_sign("item_id", "u1") != feature_sign("user_id", "u1")


@given(st.lists(st.text(max_size=40), max_size=60), st.sampled_from(["user_id", "tags", "ü"]))
def test_vectorised_equals_reference(values: list[str], slot: str) -> None:
    got = signs_of(slot, pa.array(values, pa.string()))
    assert got.dtype == np.uint64
    assert got.tolist() == [feature_sign(slot, v) for v in values]


def test_sliced_and_chunked_arrays() -> None:
    values = pa.array(["a", "bb", "ccc", "dddd", "a"])
    assert signs_of("s", values.slice(2)).tolist() == [
        feature_sign("s", v) for v in ["ccc", "dddd", "a"]
    ]
    chunked = pa.chunked_array([["a", "bb"], ["a"]])
    assert signs_of("s", chunked).tolist() == [feature_sign("s", v) for v in ["a", "bb", "a"]]


@given(st.lists(st.text(max_size=12), max_size=150), st.sampled_from(["user_id", "tags", "x"]))
def test_serving_path_equals_the_vectorised_one(values: list[str], slot: str) -> None:
    """Short lists take the plain loop, long ones the array path: the same signs."""
    expected = signs_of(slot, pa.array(values, pa.string()))
    np.testing.assert_array_equal(signs_of_values(slot, values), expected)
