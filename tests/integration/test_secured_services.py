"""A Redis that only an ACL user with a password may use, through the commands a user runs:
the right secret works, a wrong or missing one stops the command at start with the key to
fix, and the secret is in no output and no resolved config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamrec.config import PipelineConfig, dump_config
from streamrec.local_services import free_port

STREAMREC = str(Path(sys.executable).parent / "streamrec")
USER, PASSWORD, ENV = "streamrec", "acl-Pa55-word", "SR_TEST_REDIS_PASSWORD"


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[str]:
    """redis-server with its default user off and one ACL user, as a hardened Redis is."""
    port = free_port()
    log = open(tmp_path / "redis.log", "wb")  # noqa: SIM115  closed below
    server = [shutil.which("redis-server") or "redis-server", "--port", str(port)]
    server += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    server += ["--user", "default", "off", "--user", USER, "on", f">{PASSWORD}", "~*", "&*"]
    proc = subprocess.Popen(
        [*server, "+@all"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port, username=USER, password=PASSWORD, socket_timeout=1)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.1)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _secured(cfg: PipelineConfig, url: str, username: str | None) -> Path:
    redis_cfg = cfg.redis.model_copy(update={"url": url, "username": username, "password_env": ENV})
    resolved = cfg.model_copy(update={"redis": redis_cfg})
    return dump_config(resolved, Path(cfg.paths.work_root) / "secured.yaml")


def _run(args: list[str], password: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, ENV: password}
    return subprocess.run(
        [STREAMREC, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_acl_user_and_password_from_the_environment(
    make_config, acl_redis: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, PASSWORD)  # the config checks that its secret's source exists
    config = _secured(make_config(), acl_redis, USER)
    anonymous = _secured(make_config(), acl_redis, None)
    assert PASSWORD not in config.read_text() and ENV in config.read_text()

    ok = _run(["status", "--config", str(config)], PASSWORD)
    assert ok.returncode == 0, ok.stderr

    wrong = _run(["status", "--config", str(config)], "not-the-password")
    assert wrong.returncode == 2, wrong.stderr  # a ConfigError: the credentials are wrong
    assert "refused the credentials" in wrong.stderr and "redis.password_env" in wrong.stderr
    assert "not-the-password" not in wrong.stdout + wrong.stderr

    no_user = _run(["status", "--config", str(anonymous)], PASSWORD)
    assert no_user.returncode == 2 and "redis.username" in no_user.stderr, no_user.stderr

    # the service and the cluster stop at start (before uvicorn or fleetrun), with the fix
    serve = _run(["serve", "--config", str(config), "--port", str(free_port())], "wrong", 60)
    assert serve.returncode == 2, serve.stdout + serve.stderr
    assert "refused the credentials" in serve.stderr
    cluster = _run(["cluster", "--config", str(config)], "wrong", 60)
    assert cluster.returncode == 2, cluster.stdout + cluster.stderr
    assert "refused the credentials" in cluster.stderr and "fleetrun" not in cluster.stderr
