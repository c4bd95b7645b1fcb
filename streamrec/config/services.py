"""Where events come from and where the pipeline keeps its state: Kafka (with the
click join it reads) and Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from streamrec.config.base import _Strict
from streamrec.secrets import check_source, read_secret, redact_url


class KafkaConfig(_Strict):
    bootstrap_servers: str = Field(
        description="Comma-separated host:port list of the Kafka brokers, or 'embedded' to "
        "start a local broker on loopback (demo and tests)."
    )
    impressions_topic: str = Field("impressions", description="Topic of impression events.")
    partitions: int = Field(2, ge=1, description="Partitions created for the topic when missing.")
    consumer_group: str = Field(
        "streamrec-pass-builder", description="Consumer group of the pass builders."
    )
    max_message_bytes: int = Field(
        1_000_000, ge=1024, description="Events larger than this are rejected as malformed."
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="Consumer group session timeout: how long a dead builder "
        "holds its partitions before the group hands them to another.",
    )
    dlq_suffix: str = Field(
        ".dlq", description="Malformed events of topic T go to T + dlq_suffix, with the reason."
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How clients talk to the brokers (SASL_SSL in production)."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism, with a SASL_* security_protocol."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password_env: str | None = Field(
        None, description="Environment variable holding the SASL password."
    )
    sasl_password_file: Path | None = Field(
        None, description="Absolute path of a file holding the SASL password."
    )
    ssl_cafile: Path | None = Field(
        None, description="CA bundle that signed the brokers' certificates (SSL, SASL_SSL)."
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none",
        description="Codec of the batches our own producers write (streamrec produce, the "
        "dead-letter producer). The builder reads every codec whatever this says.",
    )
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        "read_committed",
        description="What the pass builder reads: 'read_committed' skips events of aborted "
        "transactions and stops at an open one (its window waits for it); "
        "'read_uncommitted' reads everything written, aborted transactions included.",
    )
    missing_event_time: Literal["dead_letter", "record_timestamp"] = Field(
        "dead_letter",
        description="An event (click) without 'event_time' ('click_time'): dead-lettered "
        "with reason missing_field, or timed by its Kafka record's timestamp.",
    )

    @model_validator(mode="after")
    def _credentials_complete(self) -> KafkaConfig:
        check_source("kafka.sasl_password", self.sasl_password_env, self.sasl_password_file)
        if self.security_protocol.startswith("SASL_") and not (
            self.sasl_username and (self.sasl_password_env or self.sasl_password_file)
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs kafka.sasl_username and "
                "kafka.sasl_password_env (or kafka.sasl_password_file)"
            )
        return self

    def sasl_password(self) -> str | None:
        """The SASL password, read from its environment variable or file."""
        return read_secret("kafka.sasl_password", self.sasl_password_env, self.sasl_password_file)


class JoinConfig(_Strict):
    mode: Literal["label_in_impression", "click_join"] = Field(
        "label_in_impression",
        description="Where labels come from: the impression's own 'label', or clicks joined "
        "from clicks_topic by event_id within label_window_seconds.",
    )
    clicks_topic: str = Field("clicks", description="Topic of click events (click_join mode).")
    label_window_seconds: int = Field(
        600, ge=1, description="A click counts if it comes this soon after its impression."
    )


class RedisConfig(_Strict):
    url: str = Field(
        description="redis:// (or rediss://) URL of the control-plane Redis, without a "
        "password, or 'embedded' to start a local redis-server on loopback."
    )
    username: str | None = Field(None, description="ACL user; default: Redis's 'default' user.")
    password_env: str | None = Field(
        None, description="Environment variable holding the Redis password."
    )
    password_file: Path | None = Field(
        None, description="Absolute path of a file holding the Redis password."
    )

    @field_validator("url")
    @classmethod
    def _no_password_in_url(cls, v: str) -> str:
        if urlsplit(v).password is not None:
            raise ValueError(
                f"{redact_url(v)} holds a password: remove it from the URL and set "
                "redis.password_env (or redis.password_file) instead, so it stays out of "
                "configs and logs"
            )
        return v

    @model_validator(mode="after")
    def _password_readable(self) -> RedisConfig:
        check_source("redis.password", self.password_env, self.password_file)
        return self

    def password(self) -> str | None:
        """The password, read from its environment variable or file."""
        return read_secret("redis.password", self.password_env, self.password_file)
