"""Kafka impressions -> validated rows -> event-time passes (Parquet + manifest).

One pass through this stage: ``producer`` pushes impressions (and clicks); ``pass_builder``
validates them (``events``; bad ones to the dead-letter topic), joins clicks onto
impressions per partition (``join``), and when a partition's watermark passes a window it
publishes that partition's slice and commits its offsets; once every partition has its
slice the pass is assembled (``slices``). ``pipe_reader`` turns a pass part into Paddle's
MultiSlot text with ``feature_signs``. No module here imports paddle.
"""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers see; at run time a name's module loads on first use
    from streaming.errors import (
        CodecUnavailable as CodecUnavailable,
        MalformedEvent as MalformedEvent,
        StreamingError as StreamingError,
    )
    from streaming.event_contract import pipeline_schemas as pipeline_schemas
    from streaming.events import (
        normalize_event as normalize_event,
        parse_event as parse_event,
        pass_table_schema as pass_table_schema,
    )
    from streaming.feature_signs import (
        SIGN_VERSION as SIGN_VERSION,
        feature_sign as feature_sign,
        signs_of as signs_of,
    )
    from streaming.pass_builder import PassBuilder as PassBuilder
    from streaming.pipe_reader import (
        multislot_text as multislot_text,
        pipe_command as pipe_command,
        slot_order as slot_order,
    )
    from streaming.slices import assemble_pass as assemble_pass, write_slice as write_slice
    from streaming.synthetic import (
        SyntheticBatch as SyntheticBatch,
        SyntheticStream as SyntheticStream,
    )


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
