"""The model registry's pointer switch on a real redis-server."""

from __future__ import annotations

import threading

import pytest
import redis

from serving_export.errors import NothingServing
from serving_export.registry import ModelRegistry
from streamrec.redis_keys import RedisKeys


@pytest.fixture
def registry(services, request) -> ModelRegistry:
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    return ModelRegistry(r, RedisKeys(f"reg-{request.node.name}"), "ctr_dnn")


def test_promote_moves_forward_only_and_rollback_is_explicit(registry: ModelRegistry) -> None:
    with pytest.raises(NothingServing):
        registry.serving()
    for v in ("202601010000", "202601010010"):
        registry.register({"version": v, "metrics": {"auc": 0.7}})
    assert registry.promote("202601010010") == (None, True)
    assert registry.promote("202601010000") == ("202601010010", False)
    assert registry.serving_version() == "202601010010"
    assert registry.rollback("202601010000") == ("202601010010", True)
    assert registry.serving()["version"] == "202601010000"


def test_concurrent_promotions_end_on_the_newest(registry: ModelRegistry) -> None:
    versions = [f"2026010100{m:02d}" for m in range(0, 60, 10)]
    for v in versions:
        registry.register({"version": v})
    threads = [threading.Thread(target=registry.promote, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registry.serving_version() == versions[-1]


def test_unregistered_version_cannot_serve(registry: ModelRegistry) -> None:
    with pytest.raises(NothingServing):
        registry.promote("209901010000")
