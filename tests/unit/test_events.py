"""Event validation: good events become rows, each kind of bad event has a reason."""

from __future__ import annotations

import json

import pytest

from streaming.errors import MalformedEvent
from streaming.events import parse_event, scoring_row
from streamrec.config import PipelineConfig, SchemaConfig

GOOD = {
    "event_id": "e1",
    "event_time": 1767225600000,
    "label": 1,
    "sparse": {"user_id": "u1", "item_id": 7, "tags": ["t1", "t2"]},
    "dense": {"price": 0.5},
}


def test_good_event_becomes_a_row(shipped_config: PipelineConfig) -> None:
    row = parse_event(json.dumps(GOOD).encode(), shipped_config.feature_schema, 10_000)
    assert row["item_id"] == "7" and row["tags"] == ["t1", "t2"]
    assert row["category"] == "" and row["user_ctr"] == 0.0  # schema defaults
    assert row["event_time_ms"] == GOOD["event_time"] and row["label"] == 1


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{nope", "bad_json"),
        (b"\xff\xfe", "bad_json"),
        (None, "empty"),
        (b"[1]", "not_an_object"),
        (json.dumps({**GOOD, "event_time": "now"}).encode(), "wrong_type"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "event_id"}).encode(), "missing_field"),
        (json.dumps({**GOOD, "label": 2}).encode(), "wrong_type"),
        (json.dumps({**GOOD, "label": True}).encode(), "wrong_type"),
        (json.dumps({**GOOD, "dense": {"price": "x"}}).encode(), "wrong_type"),
        (json.dumps({**GOOD, "dense": {"price": float("nan")}}).encode(), "not_finite"),
        (json.dumps({**GOOD, "dense": {"price": float("inf")}}).encode(), "not_finite"),
        (json.dumps({**GOOD, "sparse": {"user_id": {"a": 1}}}).encode(), "wrong_type"),
        (json.dumps({**GOOD, "sparse": {"tags": ["t"] * 1000}}).encode(), "too_many_values"),
        (b"{" + b" " * 20_000 + b"}", "oversized"),
        (b"[" * 5000 + b"]" * 5000, "bad_json"),
        (b'{"event_id": "\\ud800", "event_time": 5, "label": 1}', "bad_text"),
    ],
)
def test_malformed_events_have_a_reason(
    shipped_config: PipelineConfig, raw: bytes | None, reason: str
) -> None:
    with pytest.raises(MalformedEvent) as e:
        parse_event(raw, shipped_config.feature_schema, 10_000)
    assert e.value.reason == reason


def test_every_label_field_is_read_and_a_logged_impression_scores(
    shipped_config: PipelineConfig,
) -> None:
    from streaming.events import scoring_row
    from streamrec.config import derived

    fs = shipped_config.feature_schema.model_dump(mode="json")
    labels = [{"name": "click"}, {"name": "conversion"}]
    cfg = derived(
        shipped_config,
        "two labels in the impression",
        join={"mode": "label_in_impression"},
        schema={**fs, "labels": labels},
    )
    schema = cfg.feature_schema
    event = {**GOOD, "label_conversion": 1}
    row = parse_event(json.dumps(event).encode(), schema, 10_000)
    assert (row["label"], row["label_conversion"]) == (1, 1)
    with pytest.raises(MalformedEvent, match="label_conversion"):
        parse_event(json.dumps(GOOD).encode(), schema, 10_000)  # it must carry both
    assert scoring_row(event, schema)["price"] == 0.5  # its labels are no unknown fields
    with pytest.raises(MalformedEvent, match="label_view"):
        scoring_row({**event, "label_view": 1}, schema)


def _schema(shipped: PipelineConfig, *labels: dict) -> SchemaConfig:
    fs = shipped.feature_schema.model_dump(mode="json")
    return SchemaConfig.model_validate({**fs, "labels": list(labels)})


def _label_of(event: dict, schema: SchemaConfig) -> tuple[int, ...]:
    row = parse_event(json.dumps(event).encode(), schema, 10_000)
    return tuple(row[c] for c in schema.label_columns)


def _reason(event: dict, schema: SchemaConfig) -> MalformedEvent:
    with pytest.raises(MalformedEvent) as e:
        parse_event(json.dumps(event).encode(), schema, 10_000)
    return e.value


def test_a_label_is_read_by_its_name_never_by_its_place(shipped_config: PipelineConfig) -> None:
    """A conversion-only pipeline never reads a click's ``label``: the file of clicks is
    dead-lettered naming the field it expected."""
    conversion = _schema(shipped_config, {"name": "conversion"})
    clicks = {**GOOD, "label": 1}
    missing = _reason(clicks, conversion)
    assert missing.reason == "missing_label"
    assert "label_conversion or labels.conversion" in str(missing)
    assert _label_of({**GOOD, "label": 1, "label_conversion": 0}, conversion) == (0,)
    assert _label_of({**clicks, "labels": {"conversion": 1}}, conversion) == (1,)
    click = _schema(shipped_config, {"name": "click"})
    assert _label_of(GOOD, click) == (1,)  # today's click pipelines read as before
    bare = {k: v for k, v in GOOD.items() if k != "label"}
    assert _label_of({**bare, "label_click": 0}, click) == (0,)
    assert _reason({**bare, "label_conversion": 1}, click).reason == "missing_label"


def test_the_label_object_names_each_label(shipped_config: PipelineConfig) -> None:
    both = _schema(shipped_config, {"name": "click"}, {"name": "conversion"})
    bare = {k: v for k, v in GOOD.items() if k != "label"}
    assert _label_of({**bare, "labels": {"click": 1, "conversion": 0}}, both) == (1, 0)
    assert _label_of({**bare, "label": 0, "labels": {"conversion": 1}}, both) == (0, 1)
    # a null is no value: given once
    assert _label_of({**bare, "label": None, "labels": {"click": 1, "conversion": 1}}, both) == (
        1,
        1,
    )
    twice = _reason({**GOOD, "labels": {"click": 1, "conversion": 0}}, both)
    assert twice.reason == "ambiguous_label" and "label and labels.click" in str(twice)
    assert _reason({**GOOD, "labels": [1, 0]}, both).reason == "wrong_type"
    assert _reason({**bare, "labels": {"click": 2, "conversion": 0}}, both).reason == "wrong_type"


def test_a_label_may_name_a_field_of_its_own(shipped_config: PipelineConfig) -> None:
    own = _schema(shipped_config, {"name": "conversion", "field": "is_converted"})
    bare = {k: v for k, v in GOOD.items() if k != "label"}
    assert _label_of({**bare, "is_converted": 1}, own) == (1,)
    assert _reason({**bare, "label_conversion": 1}, own).reason == "missing_label"
    assert scoring_row({**bare, "is_converted": 1}, own)["price"] == 0.5
