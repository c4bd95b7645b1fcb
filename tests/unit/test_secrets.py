"""Secrets come from the environment or a file named in the config: they are read when a
client is built, never stored in the config, its resolved copy or an error message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streaming.kafka_clients import client_settings
from streaming.topics import security_hint
from streamrec.config import KafkaConfig, RedisConfig, dump_config, load_config
from streamrec.errors import ConfigError
from streamrec.secrets import read_secret, redact_url

REPO = Path(__file__).resolve().parents[2]


def _config_with(tmp_path: Path, **sections: dict) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    for section, values in sections.items():
        raw[section] = {**raw[section], **values}
    for key in ("schema", "model"):  # inline the shipped files, the copy lives elsewhere
        if isinstance(raw.get(key), str):
            raw[key] = yaml.safe_load((REPO / "configs" / raw[key]).read_text())
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_secret_comes_from_the_environment_or_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SR_TEST_SECRET", "from-env")
    assert read_secret("redis.password", "SR_TEST_SECRET", None) == "from-env"
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert read_secret("redis.password", None, secret) == "from-file"
    assert read_secret("redis.password", None, None) is None
    for env, file, fix in (
        ("SR_TEST_MISSING", None, "export it"),
        ("SR_TEST_SECRET", secret, "not both"),
        (None, Path("relative/pw"), "absolute path"),
        (None, tmp_path / "absent", "does not exist"),
    ):
        with pytest.raises(ConfigError, match=fix):
            read_secret("redis.password", env, file)


def test_a_password_in_the_redis_url_fails_at_load_without_echoing_it(tmp_path) -> None:
    path = _config_with(tmp_path, redis={"url": "redis://app:hunter2@db:6379/0"})
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "'redis.url'" in message and "redis.password_env" in message
    assert "hunter2" not in message
    assert redact_url("redis://app:hunter2@db:6379/0") == "redis://app:***@db:6379/0"


def test_a_missing_secret_fails_where_it_is_read_with_the_key(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SR_TEST_REDIS_PW", raising=False)
    path = _config_with(tmp_path, redis={"password_env": "SR_TEST_REDIS_PW"})
    cfg = load_config(path)  # a process that never talks to Redis does not need it
    with pytest.raises(ConfigError, match=r"redis.password_env names \$SR_TEST_REDIS_PW"):
        cfg.redis.password()
    with pytest.raises(ConfigError, match="absolute path"):  # a malformed source still fails
        load_config(_config_with(tmp_path, redis={"password_file": "relative/pw"}))
    path = _config_with(tmp_path, kafka={"security_protocol": "SASL_SSL"})
    with pytest.raises(ConfigError, match=r"needs kafka\.sasl_username"):
        load_config(path)


def test_the_resolved_config_names_the_secret_and_never_holds_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SR_TEST_REDIS_PW", "s3cret-redis")
    monkeypatch.setenv("SR_TEST_SASL_PW", "s3cret-kafka")
    path = _config_with(
        tmp_path,
        redis={
            "url": "redis://db:6379/0",
            "username": "streamrec",
            "password_env": "SR_TEST_REDIS_PW",
        },
        kafka={
            "bootstrap_servers": "k1:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "builder",
            "sasl_password_env": "SR_TEST_SASL_PW",
        },
    )
    cfg = load_config(path)
    dumped = dump_config(cfg, tmp_path / "resolved.yaml").read_text()
    assert "SR_TEST_REDIS_PW" in dumped and "s3cret" not in dumped
    assert "s3cret" not in repr(cfg)
    assert cfg.redis.password() == "s3cret-redis"
    assert client_settings(cfg.kafka) == {
        "bootstrap_servers": "k1:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "builder",
        "sasl_plain_password": "s3cret-kafka",
    }
    assert client_settings(KafkaConfig(bootstrap_servers="k:9092")) == {
        "bootstrap_servers": "k:9092",
        "security_protocol": "PLAINTEXT",
    }
    hint = security_hint(cfg.kafka)  # what a refused bootstrap names, never the secret
    for key in ("kafka.sasl_username (builder)", "kafka.sasl_password_env", "kafka.ssl_cafile"):
        assert key in hint
    assert "s3cret" not in hint
    assert security_hint(KafkaConfig(bootstrap_servers="k:9092")) == ""
    assert RedisConfig(url="redis://db:6379/0").password() is None
