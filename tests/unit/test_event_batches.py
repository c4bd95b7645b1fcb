"""The column-wise batch decoder agrees with the per-message validator, or declines."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from streaming.errors import MalformedEvent
from streaming.events import decode_impression_batch, parse_event, pass_table_schema
from streaming.synthetic import SyntheticStream
from streamrec.config import PipelineConfig, SchemaConfig

MAX = 10_000


def _slow(
    values: list[bytes], schema, carried: tuple[str, ...], served: tuple[str, ...] = ()
) -> pa.Table | None:
    rows = []
    for i, v in enumerate(values):
        try:
            row = parse_event(v, schema, MAX, carried, served=served)
        except MalformedEvent:
            return None
        rows.append({**row, "kafka_partition": 3, "kafka_offset": 100 + i})
    return pa.Table.from_pylist(rows, schema=pass_table_schema(schema, served))


def test_a_clean_batch_decodes_like_parse_event(shipped_config: PipelineConfig) -> None:
    schema = shipped_config.feature_schema
    events = SyntheticStream(schema, shipped_config.synthetic).batch(1, 600_000, 500).events
    values = [json.dumps(e).encode() for e in events]
    fast = decode_impression_batch(values, list(range(100, 600)), 3, schema, MAX)
    assert fast is not None and fast.equals(_slow(values, schema, ("label",)))


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(),
    st.text(max_size=4),
    st.lists(st.one_of(st.text(max_size=3), st.integers(0, 3), st.none()), max_size=3),
)
EVENTS = st.fixed_dictionaries(
    {
        "event_id": st.one_of(st.text(max_size=3), st.integers(0, 3)),
        "event_time": st.one_of(st.integers(-1, 3), st.just(1767225600000), st.floats()),
    },
    optional={
        "label": st.one_of(st.integers(-1, 2), st.booleans(), st.none()),
        "label_click": st.one_of(st.integers(-1, 2), st.none()),
        "label_conversion": st.one_of(st.integers(-1, 2), st.none()),
        "labels": st.one_of(
            st.none(),
            st.integers(0, 1),
            st.dictionaries(
                st.sampled_from(["click", "conversion", "view"]),
                st.one_of(st.integers(-1, 2), st.none(), st.booleans()),
            ),
        ),
        "sparse": st.one_of(
            st.none(), st.dictionaries(st.sampled_from(["user_id", "tags", "hour"]), FIELD_VALUES)
        ),
        "dense": st.one_of(
            st.none(), st.dictionaries(st.sampled_from(["price", "user_ctr"]), FIELD_VALUES)
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(EVENTS, min_size=1, max_size=6),
    st.booleans(),
    st.sampled_from(["click", "conversion"]),
)
def test_hostile_batches_match_or_decline(
    shipped_config: PipelineConfig, events, label_carried, label
) -> None:
    """Any batch, with labels given in any field or in the label object (or twice, or
    null), for a pipeline whose one label is a click or a conversion."""
    fs = shipped_config.feature_schema.model_dump(mode="json")
    schema = SchemaConfig.model_validate({**fs, "labels": [{"name": label}]})
    carried = ("label",) if label_carried else ()
    values = [json.dumps(e).encode() for e in events]
    fast = decode_impression_batch(
        values, list(range(100, 100 + len(values))), 3, schema, MAX, carried
    )
    if fast is not None:  # it may decline a valid batch, never accept an invalid one
        slow = _slow(values, schema, carried)
        assert slow is not None and fast.equals(slow)


SERVED = st.one_of(
    st.none(),
    st.integers(0, 1),
    st.fixed_dictionaries(
        {},
        optional={
            "version": st.one_of(st.none(), st.text(max_size=3), st.integers(0, 3)),
            "p": st.one_of(
                st.none(),
                st.integers(0, 1),
                st.dictionaries(
                    st.sampled_from(["click", "other"]),
                    st.one_of(st.none(), st.booleans(), st.floats(-1, 2), st.text(max_size=2)),
                ),
            ),
        },
    ),
)


def test_served_records_keep_their_version_and_scores(shipped_config: PipelineConfig) -> None:
    """A pass cut from the served log keeps what scored each row; a record without it (not
    written by ``streamrec serve``) gets nulls; both decoders agree."""
    schema = shipped_config.feature_schema
    events = SyntheticStream(schema, shipped_config.synthetic).batch(1, 600_000, 4).events
    events = [{k: v for k, v in e.items() if k != "label"} for e in events]
    events[0]["served"] = {"version": "202601010000", "p": {"click": 0.25}, "at": 5}
    events[1]["served"] = {"version": "202601010010", "p": {}}
    values = [json.dumps(e).encode() for e in events]
    fast = decode_impression_batch(values, list(range(100, 104)), 3, schema, MAX, (), ("click",))
    assert fast is not None and fast.equals(_slow(values, schema, (), ("click",)))
    assert fast["served_version"].to_pylist() == ["202601010000", "202601010010", None, None]
    assert fast["served_p_click"].to_pylist() == [0.25, None, None, None]
    bad = {**events[0], "served": {"version": "v", "p": {"click": 1.5}}}
    with pytest.raises(MalformedEvent, match=r"served\.p\.click"):
        parse_event(json.dumps(bad).encode(), schema, MAX, (), served=("click",))


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, min_size=1, max_size=6), st.lists(SERVED, min_size=6, max_size=6))
def test_hostile_served_fields_match_or_decline(
    shipped_config: PipelineConfig, events, served
) -> None:
    schema = shipped_config.feature_schema
    events = [{**e, "served": s} for e, s in zip(events, served, strict=False)]
    values = [json.dumps(e).encode() for e in events]
    offsets = list(range(100, 100 + len(values)))
    fast = decode_impression_batch(values, offsets, 3, schema, MAX, (), ("click",))
    if fast is not None:
        slow = _slow(values, schema, (), ("click",))
        assert slow is not None and fast.equals(slow)
