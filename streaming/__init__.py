"""Kafka impressions -> validated rows -> event-time passes (Parquet + manifest).

One pass through this stage: ``producer`` pushes events; ``pass_builder`` validates them
(``events``), buffers them by window, and when the watermark passes a window writes it
atomically and then commits offsets; ``pipe_reader`` turns a pass part into Paddle's
MultiSlot text with ``feature_signs``. No module here imports paddle.
"""

from streaming.errors import MalformedEvent, StreamingError
from streaming.events import normalize_event, parse_event, pass_table_schema
from streaming.feature_signs import SIGN_VERSION, feature_sign, signs_of
from streaming.pass_builder import PassBuilder, write_pass
from streaming.pipe_reader import multislot_text, pipe_command, slot_order
from streaming.synthetic import SyntheticBatch, SyntheticStream

__all__ = [
    "SIGN_VERSION",
    "MalformedEvent",
    "PassBuilder",
    "StreamingError",
    "SyntheticBatch",
    "SyntheticStream",
    "feature_sign",
    "multislot_text",
    "normalize_event",
    "parse_event",
    "pass_table_schema",
    "pipe_command",
    "signs_of",
    "slot_order",
    "write_pass",
]
