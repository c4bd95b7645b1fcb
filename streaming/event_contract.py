"""The contract producers write to: the rules an impression or label event must meet, as the
constants the builder validates with (``streaming.events``) and as the JSON Schema
(draft 2020-12) that ``streamrec schema`` prints for a pipeline's feature schema.

Both are built from the definitions below, and a property test holds them to the same
answer on any JSON value. Numbers follow JSON Schema's data model: an "integer" is any
number with no fractional part (``1767225600000`` and ``1.7672256e12`` alike); booleans are
not numbers. Two rules are about the Kafka message, not its JSON, so no JSON Schema can say
them (the schema's description does): a message above ``kafka.max_message_bytes``, and an
event timed more than ``passes.max_future_seconds`` past the wall clock, are dead-lettered.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from streamrec.config import LABELS_OBJECT, LabelSpec, PipelineConfig, SchemaConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"
MAX_EVENT_ID_LENGTH = 128
MAX_VALUES_PER_SLOT = 256
MAX_EPOCH_MS = 2**62  # exclusive, as 0 is: event and click times are 0 < t < 2**62
SPARSE_INT_MIN, SPARSE_INT_MAX = -(2**63), 2**64 - 1  # what a 64-bit id column can hold
DENSE_LIMIT = sys.float_info.max  # |dense value| <= this: finite as a double
LABELS = (0, 1)
# JSON may escape a lone surrogate ("\ud800"); it is no Unicode text, and Parquet (UTF-8)
# cannot store it
UNICODE_TEXT = "^[^\\ud800-\\udfff]*$"


def as_integer(value: Any) -> int | None:
    """The integer a decoded JSON value stands for, or None when it is not an integer
    (a fraction, a string, a boolean, infinity)."""
    kind = type(value)
    if kind is int:
        return value
    if kind is float and value.is_integer():
        return int(value)
    return None


def _epoch_ms(what: str) -> dict[str, Any]:
    return {
        "description": f"{what}: epoch milliseconds, UTC",
        "type": "integer",
        "exclusiveMinimum": 0,
        "exclusiveMaximum": MAX_EPOCH_MS,
    }


def _event_id(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_EVENT_ID_LENGTH,
        "pattern": UNICODE_TEXT,
    }


_SPARSE_VALUE = {
    "type": ["string", "integer"],
    "pattern": UNICODE_TEXT,
    "minimum": SPARSE_INT_MIN,
    "maximum": SPARSE_INT_MAX,
}


def _slot(multi: bool, default: str) -> dict[str, Any]:
    absent = f"absent or null: {default!r}"
    if not multi:
        return {**_SPARSE_VALUE, "type": ["string", "integer", "null"], "description": absent}
    return {
        **_SPARSE_VALUE,
        "type": ["array", "string", "integer", "null"],
        "items": _SPARSE_VALUE,
        "maxItems": MAX_VALUES_PER_SLOT,
        "description": f"a list of values, or one value; {absent} (an empty list too)",
    }


def _message_rules(max_message_bytes: int, max_future_seconds: int) -> str:
    return (
        f"One JSON object per Kafka message value, at most {max_message_bytes} bytes; "
        f"times more than {max_future_seconds} s past the wall clock are dead-lettered "
        "(future_time). Unknown fields are ignored."
    )


def _label_value(name: str) -> dict[str, Any]:
    return {
        "description": f"1 if {name}, else 0 (null: not given here)",
        "type": ["integer", "null"],
        "enum": [*LABELS, None],
    }


_GIVEN = {"not": {"type": "null"}}


def _given_once(label: LabelSpec) -> dict[str, Any]:
    """Exactly one of the label's fields, or its entry in the label object, holds a value."""
    return {
        "oneOf": [
            *({"required": [f], "properties": {f: _GIVEN}} for f in label.event_fields),
            {
                "required": [LABELS_OBJECT],
                "properties": {
                    LABELS_OBJECT: {
                        "type": "object",
                        "required": [label.name],
                        "properties": {label.name: _GIVEN},
                    }
                },
            },
        ]
    }


def impression_schema(
    schema: SchemaConfig,
    *,
    carried: Sequence[LabelSpec],
    require_event_time: bool,
    max_message_bytes: int,
    max_future_seconds: int,
) -> dict[str, Any]:
    """JSON Schema of an impression event: ``carried`` lists the labels it holds itself
    (the others are joined from their topics), each in exactly one of its fields or in the
    label object; ``require_event_time`` unless a missing time falls back to the record's
    timestamp."""
    required = ["event_id"]
    required += ["event_time"] if require_event_time else []
    time_note = "" if require_event_time else " (absent: the Kafka record's timestamp)"
    labels: dict[str, Any] = {}
    if carried:
        labels[LABELS_OBJECT] = {
            "description": "Label name -> 0 or 1: a label given here is not given in its field",
            "type": ["object", "null"],
            "properties": {label.name: _label_value(label.name) for label in carried},
        }
    return {
        "$schema": DIALECT,
        "title": f"impression (feature schema version {schema.version})",
        "description": _message_rules(max_message_bytes, max_future_seconds)
        + "".join(
            f" The label {label.name} is read from exactly one of "
            f"{', '.join(label.event_fields)}, {LABELS_OBJECT}.{label.name}."
            for label in carried
        ),
        "type": "object",
        "required": required,
        **({"allOf": [_given_once(label) for label in carried]} if carried else {}),
        "properties": {
            "event_id": _event_id("Unique id of the impression (label events name it)"),
            "event_time": _epoch_ms("When the impression happened" + time_note),
            **{f: _label_value(label.name) for label in carried for f in label.event_fields},
            **labels,
            "sparse": _sparse(schema, closed=False),
            "dense": _dense(schema, closed=False),
        },
    }


def _sparse(schema: SchemaConfig, *, closed: bool) -> dict[str, Any]:
    """The ``sparse`` object: ``closed``, a slot the schema lacks is refused."""
    return {
        "description": "Slot name -> value(s); a value becomes a 64-bit feature sign",
        "type": "object",
        "properties": {s.name: _slot(s.multi, s.default) for s in schema.sparse},
        **({"additionalProperties": False} if closed else {}),
    }


def _dense(schema: SchemaConfig, *, closed: bool) -> dict[str, Any]:
    """The ``dense`` object: ``closed``, a feature the schema lacks is refused."""
    return {
        "description": "Feature name -> finite number (absent: the schema's default)",
        "type": "object",
        "properties": {
            d.name: {
                "description": f"absent: {d.default}",
                "type": "number",
                "minimum": -DENSE_LIMIT,
                "maximum": DENSE_LIMIT,
            }
            for d in schema.dense
        },
        **({"additionalProperties": False} if closed else {}),
    }


def scoring_event_schema(schema: SchemaConfig) -> dict[str, Any]:
    """JSON Schema of an event to score (``/predict``, ``streamrec predict``): its features,
    an id echoed back, and the impression's time and labels (a logged impression scores as
    it is; they are ignored). Stricter than an impression: a field, slot or feature the
    schema lacks is refused, since a client that sends it expects it to count."""
    ignored = {"description": "accepted and ignored"}
    return {
        "$schema": DIALECT,
        "title": f"event to score (feature schema version {schema.version})",
        "type": "object",
        "properties": {
            "event_id": {
                "description": "Echoed back in event_ids when a string or an integer; anything "
                "else is answered as null (or a fresh id where the service logs what it served)"
            },
            "event_time": ignored,
            **{f: ignored for f in sorted(schema.label_fields)},
            "sparse": _sparse(schema, closed=True),
            "dense": _dense(schema, closed=True),
        },
        "additionalProperties": False,
    }


def label_event_schema(
    label: LabelSpec, *, require_time: bool, max_message_bytes: int, max_future_seconds: int
) -> dict[str, Any]:
    """JSON Schema of a label event on its own topic (a click, a conversion): the
    impression's id and when."""
    time_note = "" if require_time else " (absent: the Kafka record's timestamp)"
    return {
        "$schema": DIALECT,
        "title": label.name,
        "description": _message_rules(max_message_bytes, max_future_seconds),
        "type": "object",
        "required": ["event_id", label.time_key] if require_time else ["event_id"],
        "properties": {
            "event_id": _event_id(f"event_id of the impression this {label.name} labels"),
            label.time_key: _epoch_ms(f"When the {label.name} happened" + time_note),
        },
    }


def pipeline_schemas(cfg: PipelineConfig) -> dict[str, dict[str, Any]]:
    """The JSON Schema of each event kind the pipeline reads: ``impression``, and each
    label joined from its own topic (``click`` in ``click_join`` mode), as the builder
    configured by ``cfg`` validates them."""
    kafka, record_time = cfg.kafka, cfg.kafka.missing_event_time == "record_timestamp"
    limits = {
        "max_message_bytes": kafka.max_message_bytes,
        "max_future_seconds": cfg.passes.max_future_seconds,
    }
    carried = [label for label in cfg.labels if label.source == "impression"]
    schemas = {
        "impression": impression_schema(
            cfg.feature_schema, carried=carried, require_event_time=not record_time, **limits
        )
    }
    for label in cfg.topic_labels:
        schemas[label.name] = label_event_schema(label, require_time=not record_time, **limits)
    return schemas
