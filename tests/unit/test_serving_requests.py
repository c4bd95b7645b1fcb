"""What the predictor service accepts in /predict, and the reason it gives for the rest."""

from __future__ import annotations

import json

import pytest

from serving_export.predict_request import RequestRejected, parse_request
from streamrec.config import PipelineConfig


def _parse(cfg: PipelineConfig, body: object, max_events: int = 8):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, cfg.feature_schema, max_events)


def test_events_become_feature_rows_with_defaults(shipped_config: PipelineConfig) -> None:
    rows, ids = _parse(
        shipped_config,
        {"events": [{"event_id": "e1", "sparse": {"user_id": 7, "tags": ["a", "b"]}}, {}]},
    )
    assert ids == ["e1", None]
    assert rows[0]["user_id"] == "7" and rows[0]["tags"] == ["a", "b"]
    assert rows[1]["item_id"] == "" and rows[1]["tags"] == [""] and rows[1]["price"] == 0.0


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        (b"{not json", 400, "bad_json"),
        (b"\xff\xfe", 400, "bad_json"),
        ([1, 2], 422, "bad_request"),
        ({"events": {}}, 422, "bad_request"),
        ({"events": [{}] * 9}, 413, "too_many_events"),
        ({"events": [5]}, 422, "not_an_object"),
        ({"events": [{"sparse": {"nope": "1"}}]}, 422, "unknown_slot"),
        ({"events": [{"dense": {"nope": 1}}]}, 422, "unknown_feature"),
        ({"events": [{"extra": 1}]}, 422, "unknown_field"),
        ({"events": [{"sparse": {"user_id": 1.5}}]}, 422, "wrong_type"),
        ({"events": [{"sparse": {"user_id": True}}]}, 422, "wrong_type"),
        ({"events": [{"sparse": []}]}, 422, "wrong_type"),
        ({"events": [{"dense": {"price": "1"}}]}, 422, "wrong_type"),
        ({"events": [{"dense": {"price": 10**400}}]}, 422, "not_finite"),
        (b'{"events": [{"dense": {"price": NaN}}]}', 422, "not_finite"),
        ({"events": [{"sparse": {"tags": ["x"] * 10_000}}]}, 422, "too_many_values"),
    ],
)
def test_bad_requests_get_a_4xx_and_the_reason(
    shipped_config: PipelineConfig, body: object, code: int, reason: str
) -> None:
    with pytest.raises(RequestRejected) as rejected:
        _parse(shipped_config, body)
    assert rejected.value.response.status_code == code
    assert json.loads(rejected.value.response.body)["error"] == reason
