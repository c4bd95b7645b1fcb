"""Kafka impressions -> validated rows -> event-time passes (Parquet + manifest).

One pass through this stage: ``producer`` pushes impressions (and clicks); ``pass_builder``
validates them (``events``; bad ones to the dead-letter topic), joins clicks onto
impressions per partition (``join``), and when a partition's watermark passes a window it
publishes that partition's slice and commits its offsets; once every partition has its
slice the pass is assembled (``slices``). ``pipe_reader`` turns a pass part into Paddle's
MultiSlot text with ``feature_signs``. No module here imports paddle.
"""

from streaming.errors import MalformedEvent, StreamingError
from streaming.events import normalize_event, parse_event, pass_table_schema
from streaming.feature_signs import SIGN_VERSION, feature_sign, signs_of
from streaming.pass_builder import PassBuilder
from streaming.pipe_reader import multislot_text, pipe_command, slot_order
from streaming.slices import assemble_pass, write_slice
from streaming.synthetic import SyntheticBatch, SyntheticStream

__all__ = [
    "SIGN_VERSION",
    "MalformedEvent",
    "PassBuilder",
    "StreamingError",
    "SyntheticBatch",
    "SyntheticStream",
    "assemble_pass",
    "feature_sign",
    "multislot_text",
    "normalize_event",
    "parse_event",
    "pass_table_schema",
    "pipe_command",
    "signs_of",
    "slot_order",
    "write_slice",
]
