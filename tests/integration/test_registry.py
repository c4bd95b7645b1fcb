"""The model registry's pointer switch on a real redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from serving_export.delivery import registry_for
from serving_export.errors import NothingServing
from serving_export.registry import ModelRegistry
from streamrec.config import dump_config
from streamrec.redis_keys import RedisKeys


@pytest.fixture
def registry(services, request) -> ModelRegistry:
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    return ModelRegistry(r, RedisKeys(f"reg-{request.node.name}"), "ctr_dnn")


def test_promote_moves_forward_only_and_rollback_is_explicit(
    registry: ModelRegistry, artifact_manifest
) -> None:
    with pytest.raises(NothingServing):
        registry.serving()
    for v in ("202601010000", "202601010010"):
        registry.register(artifact_manifest(v, auc=0.7))
    assert registry.promote("202601010010") == (None, True)
    assert registry.promote("202601010000") == ("202601010010", False)
    assert registry.serving_version() == "202601010010"
    assert registry.rollback("202601010000") == ("202601010010", True)
    assert registry.serving().version == "202601010000"


def test_concurrent_promotions_end_on_the_newest(
    registry: ModelRegistry, artifact_manifest
) -> None:
    versions = [f"2026010100{m:02d}" for m in range(0, 60, 10)]
    for v in versions:
        registry.register(artifact_manifest(v))
    threads = [threading.Thread(target=registry.promote, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registry.serving_version() == versions[-1]


def test_unregistered_version_cannot_serve(registry: ModelRegistry) -> None:
    with pytest.raises(NothingServing):
        registry.promote("209901010000")


def test_deliver_and_rollback_through_the_cli(
    make_config, artifact_manifest, tmp_path: Path
) -> None:
    """`streamrec deliver` moves the pointer forward only; `streamrec rollback` goes back to
    the version before the serving one, or to a named one."""
    cfg = make_config()
    config = dump_config(cfg, tmp_path / "p.yaml")
    registry = registry_for(cfg)
    versions = ["202601010000", "202601010010", "202601010020"]
    for v in versions:
        registry.register(artifact_manifest(v))
    cli = str(Path(sys.executable).with_name("streamrec"))

    def run(*args: str) -> tuple[int, dict]:
        out = subprocess.run(
            [cli, *args, "--config", str(config)], capture_output=True, text=True, timeout=60
        )
        return out.returncode, json.loads(out.stdout.splitlines()[0]) if out.stdout else {}

    assert run("rollback")[0] == 1  # nothing older than nothing
    code, result = run("deliver", "--version", versions[1])
    assert code == 0 and result["serving"] == versions[1]
    code, result = run("deliver", "--version", versions[0])
    assert code == 1 and result["serving"] == versions[1]  # forward only
    assert run("deliver", "--version", versions[2])[0] == 0
    code, result = run("rollback")
    assert code == 0 and result["version"] == versions[1]
    assert registry.serving_version() == versions[1]
    assert run("rollback", "--version", versions[0])[0] == 0
    assert registry.serving_version() == versions[0]
    assert run("deliver", "--version", "209901010000")[0] == 1  # not registered
