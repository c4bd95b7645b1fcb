"""Errors of the streaming stage.

StreamingError (StreamrecError)
├── KafkaUnavailable    the brokers cannot be reached (or refuse the TLS/SASL settings)
├── CodecUnavailable    a Kafka compression codec's package is missing here
└── MalformedEvent      one event cannot be used: skip it, count it, keep its reason
"""

from streamrec.errors import StreamrecError


class StreamingError(StreamrecError):
    """Root of the streaming stage's errors."""


class KafkaUnavailable(StreamingError):
    """The brokers cannot be reached with the configured address and security settings."""

    exit_code = 3


class CodecUnavailable(StreamingError):
    """Batches use a compression codec whose package is not installed: the topic cannot be
    read (or written) until it is, as if the broker were unreachable."""

    exit_code = 3


class MalformedEvent(StreamingError):
    """An event fails validation; ``reason`` is a short machine-friendly code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
