"""Event validation: good events become rows, each kind of bad event has a reason."""

from __future__ import annotations

import json

import pytest

from streaming.errors import MalformedEvent
from streaming.events import parse_event
from streamrec.config import PipelineConfig

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
