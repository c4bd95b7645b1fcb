"""The connection settings every Kafka client of the pipeline is built with: the brokers'
addresses and, where the config asks for it, SASL and TLS (``kafka.security_protocol``).
The SASL password is read here, when a client is built, from its environment variable or
file (``streamrec.secrets``)."""

from __future__ import annotations

from typing import Any

from streaming.codecs import require
from streamrec.config import KafkaConfig


def client_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """Keyword arguments for kafka-python's producer, consumer and admin client."""
    settings: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.security_protocol.startswith("SASL_"):
        settings["sasl_mechanism"] = kafka.sasl_mechanism
        settings["sasl_plain_username"] = kafka.sasl_username
        settings["sasl_plain_password"] = kafka.sasl_password()
    if kafka.ssl_cafile is not None:
        settings["ssl_cafile"] = str(kafka.ssl_cafile)
    return settings


def producer_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """``client_settings`` plus what our producers add: the configured compression."""
    require(kafka.compression, "kafka.compression")
    codec = None if kafka.compression == "none" else kafka.compression
    return {**client_settings(kafka), "compression_type": codec}


# client_settings' keyword arguments under their librdkafka (confluent_kafka) names
LIBRDKAFKA_NAMES = {
    "bootstrap_servers": "bootstrap.servers",
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
}


def librdkafka_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """``client_settings`` in librdkafka's names, with the configured compression
    (librdkafka carries every codec itself)."""
    settings = {LIBRDKAFKA_NAMES[k]: v for k, v in client_settings(kafka).items()}
    return settings | {"compression.type": kafka.compression}
