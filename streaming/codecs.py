"""The Kafka compression codecs and the Python packages kafka-python reads them with.

Producers compress record batches with gzip, snappy, lz4 or zstd (librdkafka, the Java and
Go clients alike). kafka-python decodes each with an optional package, which the project's
dependencies install (``kafka-python[lz4,snappy,zstd]``); were one missing, the first batch
of that codec would stop a consumer with kafka-python's bare ``UnsupportedCodecError``.
``CodecUnavailable`` says instead which codec and which package.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kafka import codec
from kafka.errors import UnsupportedCodecError

from streaming.errors import CodecUnavailable

PACKAGES: dict[str, tuple[str, Callable[[], bool]]] = {  # codec -> (PyPI package, check)
    "gzip": ("the standard library's gzip", codec.has_gzip),
    "snappy": ("python-snappy", codec.has_snappy),
    "lz4": ("lz4", codec.has_lz4),
    "zstd": ("zstandard", codec.has_zstd),
}


def missing_codecs() -> list[str]:
    """Codecs kafka-python cannot read or write in this environment."""
    return [name for name, (_, available) in PACKAGES.items() if not available()]


def unavailable(name: str, what: str) -> CodecUnavailable:
    """The error for a ``name`` codec this environment lacks, met while doing ``what``."""
    package = PACKAGES[name][0] if name in PACKAGES else f"a {name} codec package"
    return CodecUnavailable(
        f"{what} needs the {name} codec, which is not installed: pip install {package} "
        "(the project's own dependencies install it: pip install -e .)"
    )


def from_kafka_error(error: UnsupportedCodecError, what: str) -> CodecUnavailable:
    """Translate kafka-python's codec error (it names the codec in its message)."""
    named = re.search(r"for (\w+) compression", str(error))
    return unavailable(named.group(1) if named else str(error), what)


def require(name: str, what: str) -> None:
    """Raise CodecUnavailable unless the ``name`` codec can be used here."""
    if name != "none" and not PACKAGES[name][1]():
        raise unavailable(name, what)
