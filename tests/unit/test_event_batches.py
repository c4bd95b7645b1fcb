"""The column-wise batch decoder agrees with the per-message validator, or declines."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.errors import MalformedEvent
from streaming.events import decode_impression_batch, parse_event, pass_table_schema
from streaming.synthetic import SyntheticStream
from streamrec.config import PipelineConfig

MAX = 10_000


def _slow(values: list[bytes], schema, carried: tuple[str, ...]) -> pa.Table | None:
    rows = []
    for i, v in enumerate(values):
        try:
            row = parse_event(v, schema, MAX, carried)
        except MalformedEvent:
            return None
        rows.append({**row, "kafka_partition": 3, "kafka_offset": 100 + i})
    return pa.Table.from_pylist(rows, schema=pass_table_schema(schema))


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
        "sparse": st.one_of(
            st.none(), st.dictionaries(st.sampled_from(["user_id", "tags", "hour"]), FIELD_VALUES)
        ),
        "dense": st.one_of(
            st.none(), st.dictionaries(st.sampled_from(["price", "user_ctr"]), FIELD_VALUES)
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, min_size=1, max_size=6), st.booleans())
def test_hostile_batches_match_or_decline(
    shipped_config: PipelineConfig, events, label_carried
) -> None:
    schema = shipped_config.feature_schema
    carried = ("label",) if label_carried else ()
    values = [json.dumps(e).encode() for e in events]
    fast = decode_impression_batch(
        values, list(range(100, 100 + len(values))), 3, schema, MAX, carried
    )
    if fast is not None:  # it may decline a valid batch, never accept an invalid one
        slow = _slow(values, schema, carried)
        assert slow is not None and fast.equals(slow)
