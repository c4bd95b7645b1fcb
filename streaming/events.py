"""The impression event and its validation against the feature schema.

An event is one JSON object per Kafka message::

    {"event_id": "e-42", "event_time": 1767225600000,        # epoch ms, UTC
     "sparse": {"user_id": "u7", "tags": ["t1", "t9"]},      # slot -> value (list if multi)
     "dense": {"price": 0.3},                                # name -> finite number
     "label": 1}                                             # 0 or 1 (clicked)

Each label of the schema (``schema.labels``) the impression carries is read by its name,
never by its place in the list: from ``label_<name>`` (``label`` for a label named click,
which also reads ``label_click``), or the label's own ``field``, or the label object
``"labels": {"click": 1, "conversion": 0}``, exactly one of them (a null is no value). A
file of clicks fed to a conversion pipeline is dead-lettered (``missing_label``, naming the
field expected), never trained as conversions. A label joined from its own topic (a click
in ``click_join`` mode, a conversion) is an event ``{"event_id": <the impression's id>,
"<name>_time": ms}`` there, and the impression then needs no field for it. The limits are
the contract's (``streaming.event_contract``, which also prints them as a JSON Schema); a
missing time may fall back to the Kafka record's timestamp (``kafka.missing_event_time``).

``parse_event`` / ``parse_label_event`` turn message bytes into a row or a label event, or
raise MalformedEvent with a reason code; they never let a bad event through.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from streaming.errors import MalformedEvent
from streaming.event_contract import (
    DENSE_LIMIT,
    LABELS,
    MAX_EPOCH_MS,
    MAX_EVENT_ID_LENGTH,
    MAX_VALUES_PER_SLOT,
    SPARSE_INT_MAX,
    SPARSE_INT_MIN,
    as_integer,
)
from streamrec.config import (
    LABELS_OBJECT,
    SERVED_VERSION,
    LabelSpec,
    SchemaConfig,
    label_column,
    served_p_column,
)

_fast_decode = msgspec.json.Decoder().decode


def pass_table_schema(schema: SchemaConfig, served: Sequence[str] = ()) -> pa.Schema:
    """Arrow schema of pass Parquet files: metadata columns, then slots, then dense. Passes
    cut from the served log (``served``: its tasks) add the version that scored each row
    and the probability it gave each task (null where the record has none)."""
    fields = [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("event_time_ms", pa.int64(), nullable=False),
        *(pa.field(column, pa.int8(), nullable=False) for column in schema.label_columns),
        pa.field("kafka_partition", pa.int32(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
    ]
    if served:
        fields.append(pa.field(SERVED_VERSION, pa.string()))
        fields += [pa.field(served_p_column(task), pa.float64()) for task in served]
    fields += [
        pa.field(s.name, pa.list_(pa.string()) if s.multi else pa.string(), nullable=False)
        for s in schema.sparse
    ]
    fields += [pa.field(d.name, pa.float64(), nullable=False) for d in schema.dense]
    return pa.schema(fields, metadata={"schema_version": str(schema.version)})


def _value(slot: str, v: Any) -> str:
    kind = type(v)  # exact types: bool is not an int here; this runs for every value
    if kind is str:
        return v if v.isascii() else _text(v, f"sparse.{slot}")
    n = v if kind is int else as_integer(v)
    if n is None or not SPARSE_INT_MIN <= n <= SPARSE_INT_MAX:
        raise MalformedEvent("wrong_type", f"sparse.{slot} values are strings or 64-bit integers")
    return str(n)


def _text(value: str, what: str) -> str:
    try:
        value.encode("utf-8")  # JSON allows lone surrogates; Parquet (UTF-8) does not
    except UnicodeEncodeError:
        raise MalformedEvent("bad_text", f"{what} is not valid Unicode text") from None
    return value


def _event_id(event: dict[str, Any]) -> str:
    event_id = event["event_id"]
    if type(event_id) is not str or not 0 < len(event_id) <= MAX_EVENT_ID_LENGTH:
        raise MalformedEvent("wrong_type", f"event_id must be a string of 1-{MAX_EVENT_ID_LENGTH}")
    return event_id if event_id.isascii() else _text(event_id, "event_id")


def _epoch_ms(event: dict[str, Any], key: str, record_time_ms: int | None) -> int:
    """The event's ``key`` time, or the record's timestamp where the config allows it."""
    if key not in event:
        if record_time_ms is None or not 0 < record_time_ms < MAX_EPOCH_MS:
            raise MalformedEvent("missing_field", key)
        return record_time_ms
    value = as_integer(event[key])
    if value is None or not 0 < value < MAX_EPOCH_MS:
        raise MalformedEvent("wrong_type", f"{key} must be positive epoch milliseconds")
    return value


def _decode(raw: bytes | None, max_bytes: int) -> Any:
    if raw is None:
        raise MalformedEvent("empty", "the message has no value")
    if len(raw) > max_bytes:
        raise MalformedEvent("oversized", f"{len(raw)} bytes > {max_bytes}")
    try:
        return _fast_decode(raw)
    except (msgspec.DecodeError, RecursionError):
        pass  # msgspec is strict (no NaN tokens, no lone surrogates): let json judge and name it
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise MalformedEvent("bad_json", str(e)[:200]) from None


def carried_labels(labels: Sequence[LabelSpec]) -> tuple[str, ...]:
    """The label columns an impression carries itself (the others are joined from topics)."""
    return tuple(
        label_column(i, label.name)
        for i, label in enumerate(labels)
        if label.source == "impression"
    )


def _given(label: LabelSpec) -> str:
    return " or ".join([*label.event_fields, f"{LABELS_OBJECT}.{label.name}"])


def read_label(event: dict[str, Any], label: LabelSpec) -> int:
    """The value of ``label`` an impression carries: from exactly one of its fields or its
    label object; MalformedEvent naming what was expected otherwise."""
    found = [(f, event[f]) for f in label.event_fields if event.get(f) is not None]
    labels = event.get(LABELS_OBJECT)
    if labels is not None:
        if not isinstance(labels, dict):
            raise MalformedEvent("wrong_type", f"{LABELS_OBJECT} must be an object")
        if labels.get(label.name) is not None:
            found.append((f"{LABELS_OBJECT}.{label.name}", labels[label.name]))
    if not found:
        raise MalformedEvent(
            "missing_label", f"{_given(label)}: this pipeline's label {label.name!r}"
        )
    if len(found) > 1:
        raise MalformedEvent(
            "ambiguous_label", f"{label.name} given twice: {' and '.join(f for f, _ in found)}"
        )
    where, value = found[0]
    if as_integer(value) not in LABELS:
        raise MalformedEvent("wrong_type", f"{where} must be 0 or 1")
    return int(value)


def normalize_event(
    event: Any,
    schema: SchemaConfig,
    carried: Sequence[str] | None = None,
    record_time_ms: int | None = None,
    served: Sequence[str] = (),
) -> dict[str, Any]:
    """Validate a decoded event and return its row; MalformedEvent when it is unusable.
    ``carried``: the label fields the event must hold (default: the schema's labels with
    source impression); a label joined from a topic starts at 0. With a ``record_time_ms``
    a missing event time becomes it. ``served``: as ``pass_table_schema``."""
    if not isinstance(event, dict):
        raise MalformedEvent("not_an_object", "the event must be a JSON object")
    carried = carried_labels(schema.labels) if carried is None else carried
    if "event_id" not in event:
        raise MalformedEvent("missing_field", "event_id")
    event_id = _event_id(event)
    event_time = _epoch_ms(event, "event_time", record_time_ms)
    row: dict[str, Any] = {"event_id": event_id, "event_time_ms": event_time}
    for column, label in zip(schema.label_columns, schema.labels, strict=True):
        row[column] = read_label(event, label) if column in carried else 0
    row.update(feature_row(event.get("sparse", {}), event.get("dense", {}), schema))
    if served:
        row.update(_served(event.get("served"), served))
    return row


def _served(value: Any, tasks: Sequence[str]) -> dict[str, Any]:
    """The version and each task's probability of a served-log record's ``served`` field
    (``serving_export.served_log``); None where it has none."""
    row: dict[str, Any] = {SERVED_VERSION: None, **{served_p_column(t): None for t in tasks}}
    if value is None:
        return row
    if not isinstance(value, dict) or not isinstance(p := value.get("p", {}), dict):
        raise MalformedEvent("wrong_type", "served must be {version, p: {task: probability}}")
    version = value.get("version")
    if version is not None and not isinstance(version, str):
        raise MalformedEvent("wrong_type", "served.version must be a string")
    row[SERVED_VERSION] = version
    for task in tasks:
        x = p.get(task)
        if x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x <= 1:
            raise MalformedEvent("wrong_type", f"served.p.{task} must be a probability")
        row[served_p_column(task)] = float(x)
    return row


def feature_row(sparse: Any, dense: Any, schema: SchemaConfig) -> dict[str, Any]:
    """The model's features of one event's ``sparse`` and ``dense`` objects: every slot and
    dense feature of the schema, defaults filled in; MalformedEvent when one is unusable.
    Names the schema lacks are ignored here (``scoring_row`` rejects them)."""
    if not isinstance(sparse, dict) or not isinstance(dense, dict):
        raise MalformedEvent("wrong_type", "sparse and dense must be objects")
    row: dict[str, Any] = {}
    layout = _layout(schema)
    slots, features = layout.slots, layout.features
    for name, multi, default in slots:
        v = sparse.get(name)
        if multi:
            if v is None:
                values = [default]
            elif type(v) is list:
                if len(v) > MAX_VALUES_PER_SLOT:
                    raise MalformedEvent("too_many_values", f"sparse.{name}")
                values = [_value(name, x) for x in v] or [default]
            else:
                values = [_value(name, v)]
            row[name] = values
        else:
            row[name] = default if v is None else _value(name, v)
    for name, missing in features:
        v = dense.get(name, missing)
        kind = type(v)
        if kind is not float and kind is not int:
            raise MalformedEvent("wrong_type", f"dense.{name} must be a number")
        # compared before the cast: an integer just past the limit would round down to it
        if not -DENSE_LIMIT <= v <= DENSE_LIMIT:  # NaN too
            raise MalformedEvent("not_finite", f"dense.{name}")
        row[name] = float(v)
    return row


# what an event to score may hold: the impression's own fields and its labels (a logged
# impression scores as it is); anything else is a client's mistake, said back to it
SCORING_FIELDS = frozenset({"event_id", "event_time", "sparse", "dense"})


def scoring_row(event: Any, schema: SchemaConfig) -> dict[str, Any]:
    """The feature row of one event to score (a ``/predict`` body's or ``streamrec
    predict``'s): stricter than training's ``feature_row``, a field, slot or dense feature
    the schema lacks is MalformedEvent, since a client that sends it expects it to count."""
    if not isinstance(event, dict):
        raise MalformedEvent("not_an_object", "an event must be a JSON object")
    layout = _layout(schema)
    if unknown := set(event) - SCORING_FIELDS - layout.label_fields:
        raise MalformedEvent("unknown_field", str(sorted(unknown)))
    sparse, dense = event.get("sparse", {}), event.get("dense", {})
    if isinstance(sparse, dict) and (unknown := sparse.keys() - layout.slot_names):
        raise MalformedEvent("unknown_slot", f"sparse: {sorted(unknown)}")
    if isinstance(dense, dict) and (unknown := dense.keys() - layout.feature_names):
        raise MalformedEvent("unknown_feature", f"dense: {sorted(unknown)}")
    return feature_row(sparse, dense, schema)


class EventLayout(NamedTuple):
    """The schema as plain values, read for every event."""

    slots: tuple[tuple[str, bool, str], ...]  # name, multi, default
    features: tuple[tuple[str, float], ...]  # name, default
    slot_names: frozenset[str]
    feature_names: frozenset[str]
    label_fields: frozenset[str]  # an event's fields a label may be given in


_last_layout: tuple[SchemaConfig, EventLayout] | None = None


def _layout(schema: SchemaConfig) -> EventLayout:
    """Plain tuples of the schema's slots and features, read for every event. Cached for the
    last schema seen; the cache holds the schema itself, so identity cannot be mistaken."""
    global _last_layout
    if _last_layout is None or _last_layout[0] is not schema:
        layout = EventLayout(
            tuple((s.name, s.multi, s.default) for s in schema.sparse),
            tuple((d.name, d.default) for d in schema.dense),
            frozenset(s.name for s in schema.sparse),
            frozenset(d.name for d in schema.dense),
            schema.label_fields,
        )
        _last_layout = (schema, layout)
    return _last_layout[1]


def parse_event(
    raw: bytes | None,
    schema: SchemaConfig,
    max_bytes: int,
    carried: Sequence[str] | None = None,
    record_time_ms: int | None = None,
    served: Sequence[str] = (),
) -> dict[str, Any]:
    """Decode and validate one impression message value (``carried``, ``served``: as
    ``normalize_event``; ``record_time_ms``: the time a missing ``event_time`` falls back
    to, if any)."""
    return normalize_event(_decode(raw, max_bytes), schema, carried, record_time_ms, served)


def parse_label_event(
    raw: bytes | None,
    max_bytes: int,
    time_key: str = "click_time",
    record_time_ms: int | None = None,
) -> tuple[str, int]:
    """Decode and validate one label event (a click, a conversion): the labelled
    impression's event_id and the event's time in ms (its ``time_key``)."""
    event = _decode(raw, max_bytes)
    if not isinstance(event, dict):
        raise MalformedEvent("not_an_object", "a label event must be a JSON object")
    if "event_id" not in event:
        raise MalformedEvent("missing_field", "event_id")
    return _event_id(event), _epoch_ms(event, time_key, record_time_ms)


def _carried_specs(schema: SchemaConfig, carried: Sequence[str]) -> dict[str, LabelSpec]:
    """Pass column -> the label an impression carries for it."""
    columns = zip(schema.label_columns, schema.labels, strict=True)
    return {column: label for column, label in columns if column in carried}


def _json_schema(schema: SchemaConfig, carried: Sequence[str], served: Sequence[str]) -> pa.Schema:
    sparse = pa.struct(
        [pa.field(s.name, pa.list_(pa.string()) if s.multi else pa.string()) for s in schema.sparse]
    )
    dense = pa.struct([pa.field(d.name, pa.float64()) for d in schema.dense])
    labels = list(_carried_specs(schema, carried).values())
    fields = [
        pa.field("event_id", pa.string()),
        pa.field("event_time", pa.int64()),
        *(pa.field(f, pa.int64()) for label in labels for f in label.event_fields),
        pa.field("sparse", sparse),
        pa.field("dense", dense),
    ]
    if labels:
        object_ = pa.struct([pa.field(label.name, pa.int64()) for label in labels])
        fields.append(pa.field(LABELS_OBJECT, object_))
    if served:
        p = pa.struct([pa.field(task, pa.float64()) for task in served])
        fields.append(pa.field("served", pa.struct([("version", pa.string()), ("p", p)])))
    return pa.schema(fields)


def decode_impression_batch(
    values: list[bytes | None],
    offsets: list[int],
    partition: int,
    schema: SchemaConfig,
    max_bytes: int,
    carried: Sequence[str] | None = None,
    served: Sequence[str] = (),
) -> pa.Table | None:
    """Rows (pass table schema) of a batch of impression messages, decoded and validated
    column-wise by Arrow's JSON reader; None unless *every* message is a well-formed event,
    in which case the caller validates message by message with ``parse_event`` (which names
    the reason of each bad one). Where it returns rows they equal ``parse_event``'s."""
    if not values or any(v is None or len(v) > max_bytes for v in values):
        return None
    carried = carried_labels(schema.labels) if carried is None else carried
    buf = b"\n".join(values)  # type: ignore[arg-type]
    # a raw newline inside a message, or an escaped surrogate: leave it to parse_event
    if buf.count(b"\n") != len(values) - 1 or b"\\ud" in buf:
        return None
    try:
        table = pajson.read_json(
            pa.BufferReader(buf),
            read_options=pajson.ReadOptions(
                block_size=max(1 << 20, len(buf) + 1), use_threads=False
            ),
            parse_options=pajson.ParseOptions(
                explicit_schema=_json_schema(schema, carried, served),
                unexpected_field_behavior="ignore",
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(values):
        return None
    event_id, event_time = table["event_id"].combine_chunks(), table["event_time"].combine_chunks()
    if event_id.null_count or event_time.null_count:
        return None
    lengths = pc.utf8_length(event_id)
    bad = pc.or_(pc.less(lengths, 1), pc.greater(lengths, MAX_EVENT_ID_LENGTH))
    too_late = pc.greater_equal(event_time, MAX_EPOCH_MS)
    bad = pc.or_(bad, pc.or_(pc.less_equal(event_time, 0), too_late))
    labels: dict[str, pa.Array] = {}
    specs = _carried_specs(schema, carried)
    for column in schema.label_columns:
        if column not in specs:
            labels[column] = pa.array(np.zeros(len(values), dtype=np.int8))
            continue
        first, *others = specs[column].event_fields
        label = table[first].combine_chunks()
        if label.null_count:  # given elsewhere, or missing: parse_event reads it by name
            return None
        if any(table[f].null_count < len(values) for f in others):
            return None
        bad = pc.or_(bad, pc.invert(pc.is_in(label, pa.array([0, 1], pa.int64()))))
        labels[column] = label.cast(pa.int8())
    if specs:
        given = table[LABELS_OBJECT].combine_chunks()
        if any(pc.struct_field(given, x.name).null_count < len(values) for x in specs.values()):
            return None  # a label object names a label too: parse_event decides
    if pc.any(bad).as_py():
        return None
    sparse, dense = table["sparse"].combine_chunks(), table["dense"].combine_chunks()
    columns: dict[str, pa.Array] = {
        "event_id": event_id,
        "event_time_ms": event_time,
        **labels,
        "kafka_partition": pa.array(np.full(len(values), partition, dtype=np.int32)),
        "kafka_offset": pa.array(offsets, pa.int64()),
    }
    for slot in schema.sparse:
        col = pc.struct_field(sparse, slot.name)
        if col.null_count:  # missing and explicit null look alike here: parse_event decides
            return None
        if slot.multi:
            counts = pc.list_value_length(col)
            if (pc.max(counts).as_py() or 0) > MAX_VALUES_PER_SLOT or pc.list_flatten(
                col
            ).null_count:
                return None
            col = pc.if_else(pc.equal(counts, 0), pa.scalar([slot.default], col.type), col)
        columns[slot.name] = col
    for feat in schema.dense:
        col = pc.struct_field(dense, feat.name)
        # Arrow rounds an integer just past the limit down to it: leave the limit's
        # neighbourhood (and NaN, infinity) to parse_event
        if col.null_count or not pc.all(pc.less(pc.abs(col), DENSE_LIMIT)).as_py():
            return None
        columns[feat.name] = col
    if served:
        record = table["served"].combine_chunks()
        columns[SERVED_VERSION] = pc.struct_field(record, "version")
        p = pc.struct_field(record, "p")
        for task in served:
            col = pc.struct_field(p, task)
            if not pc.all(pc.and_(pc.greater_equal(col, 0), pc.less_equal(col, 1))).as_py():
                return None
            columns[served_p_column(task)] = col
    return pa.table(columns, schema=pass_table_schema(schema, served))
