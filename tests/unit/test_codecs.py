"""Kafka codecs: every one kafka-python reads is installed, and its codec error becomes one
that names the codec and the package to install."""

from __future__ import annotations

import pytest
from kafka.errors import UnsupportedCodecError

from streaming.codecs import from_kafka_error, missing_codecs, require
from streaming.errors import CodecUnavailable


def test_every_codec_is_installed() -> None:
    assert missing_codecs() == []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        require(codec, "kafka.compression")


@pytest.mark.parametrize(
    ("codec", "package"), [("snappy", "python-snappy"), ("lz4", "lz4"), ("zstd", "zstandard")]
)
def test_kafka_pythons_codec_error_names_the_package(codec: str, package: str) -> None:
    error = from_kafka_error(
        UnsupportedCodecError(f"Libraries for {codec} compression codec not found"), "reading t"
    )
    assert isinstance(error, CodecUnavailable) and error.exit_code == 3
    assert f"reading t needs the {codec} codec" in str(error)
    assert f"pip install {package} " in str(error)
