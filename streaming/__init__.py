"""Kafka impressions -> validated rows -> event-time passes (Parquet + manifest).

One pass through this stage: ``producer`` pushes impressions (and clicks); ``pass_builder``
validates them (``events``; bad ones to the dead-letter topic), joins clicks onto
impressions per partition (``join``), and when a partition's watermark passes a window it
publishes that partition's slice and commits its offsets; once every partition has its
slice the pass is assembled (``slices``). ``pipe_reader`` turns a pass part into Paddle's
MultiSlot text with ``feature_signs``. No module here imports paddle.
"""

from streamrec.lazy import lazy_exports

_EXPORTS = {
    "CodecUnavailable": "streaming.errors",
    "MalformedEvent": "streaming.errors",
    "PassBuilder": "streaming.pass_builder",
    "SIGN_VERSION": "streaming.feature_signs",
    "StreamingError": "streaming.errors",
    "SyntheticBatch": "streaming.synthetic",
    "SyntheticStream": "streaming.synthetic",
    "assemble_pass": "streaming.slices",
    "feature_sign": "streaming.feature_signs",
    "multislot_text": "streaming.pipe_reader",
    "normalize_event": "streaming.events",
    "parse_event": "streaming.events",
    "pipeline_schemas": "streaming.event_contract",
    "pass_table_schema": "streaming.events",
    "pipe_command": "streaming.pipe_reader",
    "signs_of": "streaming.feature_signs",
    "slot_order": "streaming.pipe_reader",
    "write_slice": "streaming.slices",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
