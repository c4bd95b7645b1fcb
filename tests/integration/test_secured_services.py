"""A Redis that only an ACL user with a password may use, through the commands a user runs:
the right secret works, a wrong or missing one stops the command at start with the key to
fix, and the secret is in no output and no resolved config."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.entry import STOPPED
from streamrec.passes import pass_dir, read_manifest
from streamrec.ports import free_port
from trainers.control_plane import ClusterClient

STREAMREC = str(Path(sys.executable).parent / "streamrec")
USER, PASSWORD, ENV = "streamrec", "acl-Pa55-word", "SR_TEST_REDIS_PASSWORD"


# A hardened Redis: nobody logs in as the default user. Its permissions stay, because a
# Redis without the fix of redis/redis#14545 (Debian 12's 7.0 among them) replays MULTI/EXEC
# from the append-only file as that user: stripped of them, a restart drops every
# transaction (found by the chaos soak: done markers and registry switches gone).
HARDENED = ["default", "off", "~*", "&*", "+@all"]
STRIPPED = ["default", "off"]  # what the Redis docs' first example does; loses transactions


@contextmanager
def redis_with_acl(directory: Path, default_user: list[str]) -> Iterator[str]:
    """redis-server keeping an append-only file, with ``default_user``'s rules and one ACL
    user (``USER``, ``PASSWORD``); its URL."""
    port = free_port()
    log = open(directory / "redis.log", "wb")  # noqa: SIM115  closed below
    server = [shutil.which("redis-server") or "redis-server", "--port", str(port)]
    server += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--dir", str(directory)]
    server += ["--user", *default_user, "--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all"]
    proc = subprocess.Popen(server, stdout=log, stderr=subprocess.STDOUT)
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


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[str]:
    with redis_with_acl(tmp_path, HARDENED) as url:
        yield url


def _on(cfg: PipelineConfig, url: str, username: str | None) -> PipelineConfig:
    """``cfg`` pointed at ``url`` as ``username``, its password read from ``ENV``."""
    return derived(
        cfg,
        f"the config as {username}",
        redis={"url": url, "username": username, "password_env": ENV},
    )


def _secured(cfg: PipelineConfig, url: str, username: str | None) -> Path:
    return dump_config(_on(cfg, url, username), Path(cfg.paths.work_root) / "secured.yaml")


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


def test_a_cluster_trains_on_the_acl_redis(
    make_config, build_passes, acl_redis: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the right secret the whole control plane works: fleetrun's workers get it
    through the environment ``streamrec cluster`` passes on, train a pass on commands sent
    through the ACL user, and ``streamrec status`` reads their results."""
    monkeypatch.setenv(ENV, PASSWORD)
    plain = make_config(
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 4000},
    )
    cfg = _on(plain, acl_redis, USER)
    config = _secured(plain, acl_redis, USER)
    first = next(iter(build_passes(cfg, "202608010000", 1)))
    log = Path(cfg.paths.work_root) / "cluster.log"
    with log.open("wb") as out:
        cluster = subprocess.Popen(
            [STREAMREC, "cluster", "--config", str(config)],
            env={**os.environ, ENV: PASSWORD},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        client = ClusterClient.from_config(cfg)
        # as a user reads "cluster ready" in its log: a command sent before any worker is
        # up fails fast (ClusterUnavailable), which 11 s of start-up on a loaded CI machine hit
        deadline = time.monotonic() + cfg.cluster.start_timeout_seconds
        while len(client.live_workers()) < cfg.cluster.workers:
            assert cluster.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no worker came up: " + log.read_text()[-3000:]
            time.sleep(0.5)
        result = client.run("train", first, timeout_s=240)
        rows = read_manifest(pass_dir(cfg.paths.data_root, first)).rows
        assert result["train"]["count"] == result["test"]["count"] == rows > 0
        status = _run(["status", "--config", str(config), "--json"], PASSWORD)
        assert status.returncode == 0, status.stderr
        trained = {p["pass_id"]: p for p in json.loads(status.stdout)["passes"]}
        assert trained[first]["trained"], status.stdout
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(cfg.cluster.stop_grace_seconds + 10)
        except subprocess.TimeoutExpired:
            cluster.kill()
            pytest.fail("streamrec cluster did not stop on SIGTERM")
    assert cluster.returncode == 0, log.read_text()[-3000:]
    # no log, resolved config, checkpoint or pass file the run wrote holds the secret
    written = [p for p in Path(cfg.paths.work_root).parent.rglob("*") if p.is_file()]
    assert log in written and len(written) > 10
    assert [p for p in written if PASSWORD.encode() in p.read_bytes()] == []


@pytest.mark.parametrize("default_user", [STRIPPED, HARDENED], ids=["stripped", "hardened"])
def test_serve_warns_when_redis_would_drop_transactions_on_restart(
    make_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_user: list[str]
) -> None:
    """``streamrec serve`` (as ``streamrec cluster``) warns at start, with the fix, when the
    default user of a Redis keeping an append-only file has lost its permissions."""
    monkeypatch.setenv(ENV, PASSWORD)
    with redis_with_acl(tmp_path, default_user) as url:
        config = _secured(make_config(), url, USER)
        proc = subprocess.Popen(
            [STREAMREC, "serve", "--config", str(config), "--port", str(free_port())],
            env={**os.environ, ENV: PASSWORD},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        output = []
        try:
            for line in proc.stderr:  # the service logs while it starts, then listens
                output.append(line)
                if "Uvicorn running" in line or "Application startup complete" in line:
                    break
        finally:
            proc.send_signal(signal.SIGTERM)
            output.append(proc.communicate(timeout=60)[1])
        logged = "".join(output)
        assert proc.returncode == STOPPED, logged  # stopped by the signal, gracefully
    warned = "user default off ~* &* +@all" in logged
    assert warned == (default_user == STRIPPED), logged
