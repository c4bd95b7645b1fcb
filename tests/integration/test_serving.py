"""The online predictor service, through `streamrec serve` on real parts: a fleetrun cluster
trains passes, versions are published (full, then deltas) and delivered to a real
redis-server, and uvicorn services with both sparse stores follow the registry.

- skew: the services' CTRs over HTTP equal the cluster's own inference on the same rows to
  1e-5, for a full version and for one rebuilt from it + 3 deltas, with both stores (the
  in-process one following deliveries, and one started fresh on the delta version with
  `--runtime onnx`: the ONNX export on onnxruntime)
- hot swap under load: 4 client threads while 3 versions are delivered and one rollback
  happens: no failed request, every answer names a version the service served during that
  request and equals that version's own scores (no mix of versions)
- Redis layers under concurrent reads: a version being written is never visible half-done
- atomic delivery: `streamrec publish` + `streamrec deliver` SIGKILLed at random points;
  the pointer always names a whole version and the services keep answering
- a scoring failure (a corrupt value in the Redis store) is a counted 500 with its reason
- hostile requests (hypothesis): 4xx with a reason, never 5xx, the service keeps serving;
  `streamrec predict` rejects the same events with the same reasons (exit 4)
- overload: past serving.max_in_flight a fast 503 with its reason and Retry-After, counted;
  the probes answer throughout and the service serves every request once the load goes
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
import redis
from hypothesis import HealthCheck, given, settings, strategies as st
from openapi_check import OpenApi
from pass_rows import cluster_scores, pass_events
from serve_process import STREAMREC, Service
from topic_reads import read_topic

from devservices.kafka_broker import KafkaNode, restart_kafka_node, start_kafka_cluster
from ops.pass_sequence import run_pass
from serving_export import delivery
from serving_export.artifact import verify_artifact
from serving_export.manifest import ArtifactManifest
from serving_export.predictor import Predictor
from serving_export.sparse_store import LayerMissing, RedisStore
from streaming.feature_signs import signs_of_values
from streaming.producer import make_producer
from streaming.topics import ensure_topic
from streamrec.config import DEFAULT_SPARSE_TABLE, PipelineConfig, derived, dump_config
from streamrec.passes import PassClock, pass_dir, read_manifest
from streamrec.ports import free_port
from streamrec.redis_keys import RedisKeys
from trainers.launcher import LocalCluster

pytestmark = pytest.mark.slow

FIRST = "202610010000"
PASSES = [  # 8 windows of 10 minutes
    (datetime(2026, 10, 1) + timedelta(minutes=10 * i)).strftime("%Y%m%d%H%M") for i in range(8)
]
TOKEN_ENV = "SR_TEST_SERVING_TOKEN"


@dataclass
class Stack:
    cfg: PipelineConfig
    config: Path
    cluster: LocalCluster
    batches: dict[str, Any]
    services: dict[str, Service] = field(default_factory=dict)
    trained: list[str] = field(default_factory=list)

    def train_and_deliver(self, pass_id: str) -> ArtifactManifest:
        """``pass_id`` through the steps the DAG runs (``ops.pass_sequence``); its manifest."""
        done = run_pass(self.cfg, self.cluster.client, pass_id)
        assert done.version == pass_id, done.decision.reasons  # the gate here is open
        self.trained.append(pass_id)
        return delivery.registry_for(self.cfg).manifest(pass_id)

    def pass_events(self, pass_id: str) -> list[dict[str, Any]]:
        return pass_events(self.cfg, pass_id)

    def cluster_scores(self, pass_id: str, events: list[dict[str, Any]]) -> np.ndarray:
        return cluster_scores(self.cluster.client, pass_id, events)


def _post_all(service: Service, events: list[dict[str, Any]]) -> tuple[set[str], np.ndarray]:
    versions, scores = set(), []
    for i in range(0, len(events), 500):
        version, p = service.predict(events[i : i + 500])
        versions.add(version)
        scores.append(p)
    return versions, np.concatenate(scores)


@pytest.fixture(scope="module")
def stack(make_config, build_passes) -> Iterator[Stack]:
    cfg = make_config(
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 4000},
        checkpoints={"base_every_passes": 4, "keep_bases": 3},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
        serving={"sparse_store": "redis", "poll_seconds": 0.1},
    )
    batches = build_passes(cfg, FIRST, len(PASSES))
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, config) as cluster:
        s = Stack(cfg, config, cluster, batches)
        logs = Path(cfg.paths.work_root)
        try:
            s.services["inprocess"] = Service(config, "inprocess", logs / "serve-inprocess.log")
            s.services["redis"] = Service(config, "redis", logs / "serve-redis.log")
            yield s
        finally:
            with ExitStack() as stops:  # every service is stopped, even if one fails to
                for service in s.services.values():
                    stops.callback(service.stop)


def test_services_score_like_the_cluster_full_and_after_three_deltas(stack: Stack) -> None:
    for svc in stack.services.values():  # nothing delivered yet: alive, not ready
        assert svc.client.get("/healthz").status_code == 200
        assert svc.client.get("/readyz").status_code == 503
        assert svc.client.post("/predict", json={"events": [{}]}).status_code == 503

    first = stack.train_and_deliver(PASSES[0])
    assert first.sparse.kind == "full"
    events = stack.pass_events(PASSES[0])
    expected = stack.cluster_scores(PASSES[0], events)
    for svc in stack.services.values():
        svc.wait_for(PASSES[0])
        versions, got = _post_all(svc, events)
        assert versions == {PASSES[0]}
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)

    deltas = [stack.train_and_deliver(pass_id).sparse for pass_id in PASSES[1:4]]
    assert [d.kind for d in deltas] == ["delta"] * 3
    # a mode-0 base does not reset the keys' delta scores: the first delta after it also
    # carries the keys trained before the base (here, the whole young table); later ones
    # only what their pass touched
    assert all(d.keys < d.table_keys for d in deltas[1:]), deltas
    assert deltas[-1].parent == PASSES[2]
    events = stack.pass_events(PASSES[3])
    expected = stack.cluster_scores(PASSES[3], events)
    # started on the delta version: rebuilt from scratch, its dense program on onnxruntime
    fresh = Service(
        stack.config, "inprocess", Path(stack.cfg.paths.work_root) / "fresh.log", runtime="onnx"
    )
    try:
        for svc in [*stack.services.values(), fresh]:
            svc.wait_for(PASSES[3])
            versions, got = _post_all(svc, events)
            assert versions == {PASSES[3]}
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
        onnx = Predictor(
            Path(stack.cfg.paths.model_root) / stack.cfg.model.model / PASSES[3], runtime="onnx"
        )
        np.testing.assert_allclose(onnx.score(events), expected, rtol=0, atol=1e-5)
        info = fresh.client.get("/version").json()
        assert info["sparse"]["kind"] == "delta"
        assert info["freshness"]["window_end"] == "2026-10-01T00:40:00+00:00"
        assert info["freshness"]["served_at"] is not None
        assert info["age_seconds"] > 0
    finally:
        fresh.stop()
    layers = RedisStore.from_config(
        stack.cfg.redis,
        RedisKeys(stack.cfg.name),
        stack.cfg.model.model,
        Path(stack.cfg.paths.model_root) / stack.cfg.model.model,
    ).written()
    assert sorted(layers) == PASSES[:4]
    assert [layers[v].kind for v in PASSES[:4]] == ["full", "delta", "delta", "delta"]


def _expected_by_version(stack: Stack, versions: list[str], events: list[dict]) -> dict:
    model_dir = Path(stack.cfg.paths.model_root) / stack.cfg.model.model
    return {v: Predictor(model_dir / v).score(events) for v in versions}


def test_hot_swap_under_load_never_fails_or_mixes_versions(stack: Stack) -> None:
    assert stack.trained == PASSES[:4], "runs after the skew test"
    probe = stack.batches[PASSES[4]].events[:64]
    answers: list[tuple[float, float, str, str, np.ndarray]] = []
    failures: list[str] = []
    stop = threading.Event()

    def load(name: str, svc: Service) -> None:
        client = httpx.Client(base_url=svc.url, timeout=30)
        while not stop.is_set():
            started = time.time()
            try:
                r = client.post("/predict", json={"events": probe})
            except httpx.HTTPError as e:
                failures.append(f"{name}: {e!r}")
                continue
            if r.status_code != 200:
                failures.append(f"{name}: {r.status_code} {r.text}")
                continue
            body = r.json()
            answers.append((started, time.time(), name, body["version"], np.array(body["p_click"])))
        client.close()

    threads = [
        threading.Thread(target=load, args=(name, svc))
        for name, svc in stack.services.items()
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    try:
        for pass_id in PASSES[4:7]:
            stack.train_and_deliver(pass_id)
            time.sleep(1.0)
        previous, switched = delivery.rollback(stack.cfg, PASSES[5])
        assert (previous, switched) == (PASSES[6], True)
        for svc in stack.services.values():
            svc.wait_for(PASSES[5])
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[:5]
    print(f"hot swap: {len(answers)} answers, versions {sorted({a[3] for a in answers})}")
    assert len(answers) > 100
    served = {
        name: svc.client.get("/version").json()["swaps"] for name, svc in stack.services.items()
    }
    expected = _expected_by_version(stack, PASSES[3:7], probe)
    seen = set()
    for started, ended, name, version, scores in answers:
        seen.add(version)
        swaps = served[name]  # {version, before, after} of each swap, in order
        spans = [  # a version serves from just before its swap to just after the next one
            (
                s["version"],
                s["before"],
                swaps[i + 1]["after"] if i + 1 < len(swaps) else float("inf"),
            )
            for i, s in enumerate(swaps)
        ]
        assert any(
            v == version and since <= ended and started <= until for v, since, until in spans
        ), (
            name,
            version,
            started,
            ended,
            swaps,
        )
        np.testing.assert_allclose(scores, expected[version], rtol=0, atol=1e-6)
    assert seen == set(PASSES[3:7]), seen


def test_redis_layer_being_written_is_never_read(stack: Stack) -> None:
    store = RedisStore.from_config(
        stack.cfg.redis,
        RedisKeys(stack.cfg.name),
        stack.cfg.model.model,
        Path(stack.cfg.paths.model_root) / stack.cfg.model.model,
    )
    older, newer = PASSES[5], PASSES[6]
    model_dir = store.model_dir
    signs = np.concatenate(
        [
            np.load(model_dir / v / "sparse" / DEFAULT_SPARSE_TABLE / "keys.npy")
            for v in (PASSES[0], newer)
        ]
    )
    expected_older = store.embeddings_for(older).lookup(DEFAULT_SPARSE_TABLE, signs)
    expected_newer = store.embeddings_for(newer).lookup(DEFAULT_SPARSE_TABLE, signs)
    assert not np.array_equal(expected_older, expected_newer)
    store.drop(newer)
    errors: list[str] = []
    done = threading.Event()
    newer_views = 0

    def read() -> None:
        nonlocal newer_views
        view = store.embeddings_for(older)
        while not done.is_set():
            if not np.array_equal(view.lookup(DEFAULT_SPARSE_TABLE, signs), expected_older):
                errors.append("the older version changed while the newer was written")
            try:
                got = store.embeddings_for(newer).lookup(DEFAULT_SPARSE_TABLE, signs)
            except LayerMissing:
                continue
            newer_views += 1
            if not np.array_equal(got, expected_newer):
                errors.append("a view of the newer version saw it half-written")

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    time.sleep(0.2)
    store.push(newer)
    time.sleep(0.5)
    done.set()
    for t in readers:
        t.join()
    assert not errors, errors[:3]
    assert newer_views > 0


def test_publish_and_deliver_survive_sigkill(stack: Stack) -> None:
    """`streamrec publish` + `streamrec deliver` killed at random points, five times: the
    pointer always names a whole version with its Redis layers, the services keep serving."""
    pass_id = PASSES[7]
    trained = stack.cluster.client.train(pass_id)
    delivery.evaluate(stack.cfg, trained)
    raw = stack.cluster.client.export(pass_id).raw_export
    svc = stack.services["redis"]
    probe = stack.batches[pass_id].events[:8]
    rng = random.Random(11)
    store = RedisStore.from_config(
        stack.cfg.redis,
        RedisKeys(stack.cfg.name),
        stack.cfg.model.model,
        Path(stack.cfg.paths.model_root) / stack.cfg.model.model,
    )
    script = (
        f"{STREAMREC} publish --config {stack.config} --raw-export {raw} && "
        f"{STREAMREC} deliver --config {stack.config} --version {pass_id}"
    )

    def take_back() -> None:
        shutil.rmtree(store.model_dir / pass_id)
        delivery.rollback(stack.cfg, PASSES[5])
        delivery.registry_for(stack.cfg).forget(pass_id)
        store.drop(pass_id)

    # kill times are fractions of an unkilled run's duration (it varies by machine)
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    duration = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    take_back()
    kills = 0
    for attempt in range(20):
        proc = subprocess.Popen(
            ["bash", "-c", script],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.05, 0.9) * duration)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        else:  # it finished before the kill: the unkilled run was slower (a busier moment)
            duration *= 0.7
        proc.wait()
        serving = delivery.registry_for(stack.cfg).serving_version()
        verify_artifact(store.model_dir / serving)
        store.embeddings_for(serving)  # raises LayerMissing when a layer is incomplete
        version, _ = svc.predict(probe)
        assert version in (PASSES[5], pass_id)
        if kills >= 5 and attempt >= 5:
            break
        if serving == pass_id:  # finished before the kill: take the delivery back, again
            take_back()
    print(f"delivery: {kills} SIGKILLs in {attempt + 1} attempts of a {duration:.1f} s run")
    assert kills >= 5
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    svc.wait_for(pass_id)


HOSTILE_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
SLOT_VALUES = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=4) | st.integers(), max_size=3),
)


@st.composite
def hostile_bodies(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "events", "event"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(HOSTILE_JSON)).encode()
    if kind == "events":
        return json.dumps({"events": draw(st.lists(HOSTILE_JSON, max_size=3))}).encode()
    slots = ["user_id", "item_id", "category", "hour", "tags", "nope", ""]
    event = {
        "sparse": draw(st.dictionaries(st.sampled_from(slots), SLOT_VALUES, max_size=4)),
        "dense": draw(
            st.dictionaries(
                st.sampled_from(["ctx_a", "ctx_b", "x"]),
                st.integers() | st.floats() | st.text(max_size=3),
                max_size=2,
            )
        ),
    }
    return json.dumps({"events": [event]}, allow_nan=True).encode()


def _strict_json(body: bytes) -> Any:
    """``body`` as JSON (RFC 8259: no NaN or Infinity, which no JSON Schema speaks of), or
    ``NOT_JSON``."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(body, parse_constant=refuse)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return NOT_JSON


NOT_JSON = object()


def test_hostile_requests_get_4xx_and_the_service_keeps_serving(stack: Stack) -> None:
    """Each answer is what /openapi.json declares for its status, and a body is scored
    exactly when it matches the document's request schema."""
    svc = stack.services["inprocess"]
    api = OpenApi(svc.client)
    codes: dict[int, int] = {}

    # derandomized: the same bodies every run, so the count of each side below cannot flake
    @settings(
        max_examples=250,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(hostile_bodies())
    def post(body: bytes) -> None:
        r = svc.client.post("/predict", content=body, headers={"content-type": "application/json"})
        codes[r.status_code] = codes.get(r.status_code, 0) + 1
        assert r.status_code < 500, (body, r.text)
        api.check(r)
        if (decoded := _strict_json(body)) is not NOT_JSON:
            errors = api.request_errors("/predict", decoded)
            assert (r.status_code == 200) == (not errors), (body, r.text, errors)

    post()
    print(f"hostile requests: status codes {codes}")
    assert codes.get(200, 0) >= 10 and sum(n for c, n in codes.items() if c != 200) >= 10, codes
    big = b'{"events": [' + b"{}," * 3_000_000 + b"{}]}"
    assert svc.client.post("/predict", content=big).status_code == 413
    many = {"events": [{}] * (stack.cfg.serving.max_events + 1)}
    assert api.request_errors("/predict", many)
    r = svc.client.post("/predict", json=many)
    assert r.json()["error"] == "too_many_events"
    api.check(r)
    unknown = svc.client.post("/predict", json={"events": [{"sparse": {"nope": "1"}}]})
    assert (unknown.status_code, unknown.json()["error"]) == (422, "unknown_slot")
    version, scores = svc.predict([{"sparse": {"user_id": "never-seen"}}])
    assert version and np.isfinite(scores).all()
    metrics = svc.client.get("/metrics").text
    assert 'streamrec_serving_requests_total{code="422",endpoint="predict"}' in metrics
    assert "streamrec_serving_version_age_seconds" in metrics


def test_every_answer_is_what_openapi_json_says(stack: Stack) -> None:
    """/openapi.json, as the service serves it, declares each route's answers and refusals
    and the serving version's event schema; real answers match it, and the check fails on an
    answer that does not."""
    assert stack.trained, "runs after the skew test"
    svc = stack.services["redis"]
    api = OpenApi(svc.client)
    schema = stack.cfg.feature_schema
    event = api.spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    items = event["schema"]["properties"]["events"]["items"]
    assert sorted(items["properties"]["sparse"]["properties"]) == sorted(
        s.name for s in schema.sparse
    )
    assert sorted(items["properties"]["dense"]["properties"]) == sorted(
        d.name for d in schema.dense
    )
    events = stack.pass_events(stack.trained[-1])[:50]
    assert not api.request_errors("/predict", {"events": events})
    answers = [
        svc.client.post("/predict", json={"events": events}),
        svc.client.post("/predict", json={"events": [{"event_id": 7}, {"dense": {}}]}),
        svc.client.get("/version"),
        svc.client.get("/healthz"),
        svc.client.get("/readyz"),
        svc.client.get("/metrics"),
        svc.client.post("/predict", content=b"{"),
        svc.client.post("/predict", json=[]),
        svc.client.post("/predict", json={"events": [{"dense": {"price": "high"}}]}),
    ]
    assert [r.status_code for r in answers] == [200, 200, 200, 200, 200, 200, 400, 422, 422]
    for r in answers:
        api.check(r)
    predicted, version = answers[0].json(), answers[2].json()
    assert predicted["event_ids"] == [e["event_id"] for e in events]
    assert answers[1].json()["event_ids"] == [7, None]
    assert [s["version"] for s in version["swaps"]][-1] == version["version"]
    # and the check can fail: an answer missing a field, or of a wrong type, or undeclared
    for broken in ({**predicted, "p_click": "0.5"}, {"version": "x"}, {**predicted, "x": 1}):
        assert api.answer_errors("post", "/predict", 200, "application/json", broken)
    assert api.answer_errors("get", "/version", 200, "application/json", {**version, "age": 1})
    assert api.answer_errors("get", "/healthz", 418, "application/json", {"status": "ok"})
    assert api.request_errors("/predict", {"events": [{"sparse": {"nope": "1"}}]})


def test_a_scoring_failure_is_a_counted_500_and_the_service_keeps_serving(stack: Stack) -> None:
    """A value in the Redis store that is no embedding (the store written by something
    else) fails the scoring of the request that meets it: a 500 with its reason, counted in
    the metrics, and the service serves again once the value is gone."""
    svc = stack.services["redis"]
    event = {"sparse": {"user_id": "a-key-the-store-holds-badly"}}
    version, _ = svc.predict([event])
    layer = RedisKeys(stack.cfg.name).sparse_layer(
        stack.cfg.model.model, version, DEFAULT_SPARSE_TABLE
    )
    field = signs_of_values("user_id", ["a-key-the-store-holds-badly"]).astype("<u8").tobytes()
    r = redis.Redis.from_url(stack.cfg.redis.url)
    r.hset(layer, field, b"not 36 bytes")
    try:
        failed = svc.client.post("/predict", json={"events": [event]})
        assert (failed.status_code, failed.json()["error"]) == (500, "internal_error")
        metrics = svc.client.get("/metrics").text
        assert 'streamrec_serving_requests_total{code="500",endpoint="predict"} 1.0' in metrics
    finally:
        r.hdel(layer, field)
    assert svc.predict([event])[0] == version


def test_streamrec_predict_rejects_what_predict_rejects(stack: Stack, tmp_path: Path) -> None:
    """`streamrec predict` validates an events file as /predict validates a body: the same
    reason for each bad event, given with its line, exit 4; good lines are scored."""
    svc = stack.services["inprocess"]
    good = stack.pass_events(stack.trained[-1])[:3]
    events = tmp_path / "events.jsonl"

    def predict_cli(*lines: str) -> subprocess.CompletedProcess:
        events.write_text("".join(f"{line}\n" for line in lines))
        command = [STREAMREC, "predict", "--config", str(stack.config), "--events", str(events)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    for bad in ([1, 2], {"extra": 1}, {"sparse": {"nope": "1"}}, {"sparse": {"user_id": 1.5}}):
        r = svc.client.post("/predict", json={"events": [good[0], bad]})
        assert r.status_code == 422 and r.json()["detail"].startswith("events[1]:"), r.text
        done = predict_cli(json.dumps(good[0]), json.dumps(bad))
        assert done.returncode == 4, (bad, done.stderr)
        assert f"events.jsonl:2: {r.json()['error']}: " in done.stderr, (bad, done.stderr)
    done = predict_cli(json.dumps(good[0]), "{not json")
    assert done.returncode == 4 and "events.jsonl:2: bad_json: " in done.stderr, done.stderr
    done = predict_cli(*(json.dumps(e) for e in good))
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [p["event_id"] for p in printed] == [e["event_id"] for e in good]
    assert all(0 < p["p_click"] < 1 for p in printed)


def test_a_bearer_token_guards_predictions(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """With serving.bearer_token_env set, /predict and /version need the token; the probes
    and the metrics stay open for the orchestrator."""
    token = "tok-" + "7" * 32
    monkeypatch.setenv(TOKEN_ENV, token)  # the service process inherits it
    cfg = derived(stack.cfg, "the token's config", serving={"bearer_token_env": TOKEN_ENV})
    work = Path(stack.cfg.paths.work_root)
    config = dump_config(cfg, work / "token.yaml")
    assert token not in config.read_text()
    version = stack.services["inprocess"].client.get("/readyz").json()["version"]
    svc = Service(config, "inprocess", work / "serve-token.log")
    try:
        svc.wait_for(version)  # /readyz is open
        events = stack.pass_events(stack.trained[-1])[:20]
        api = OpenApi(svc.client)  # open, as the probes are
        schemes = api.spec["components"]["securitySchemes"]
        assert [s["scheme"] for s in schemes.values()] == ["bearer"]
        assert "securitySchemes" not in OpenApi(stack.services["inprocess"].client).spec.get(
            "components", {}
        )  # the open service declares none
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": token}):
            r = svc.client.post("/predict", json={"events": events}, headers=headers)
            assert (r.status_code, r.json()["error"]) == (401, "unauthorized"), r.text
            assert r.headers["www-authenticate"] == "Bearer"  # RFC 6750
            api.check(r)
        r = svc.client.get("/version")
        assert r.status_code == 401
        api.check(r)
        auth = {"authorization": f"Bearer {token}"}
        r = svc.client.post("/predict", json={"events": events}, headers=auth)
        assert r.status_code == 200 and r.json()["version"] == version, r.text
        _, open_scores = stack.services["inprocess"].predict(events)
        np.testing.assert_allclose(r.json()["p_click"], open_scores, rtol=0, atol=1e-6)
        assert svc.client.get("/version", headers=auth).json()["version"] == version
        metrics = svc.client.get("/metrics").text
        assert 'streamrec_serving_requests_total{code="401",endpoint="predict"} 3.0' in metrics
    finally:
        svc.stop()
    assert token not in (work / "serve-token.log").read_text()


def test_overload_gets_a_fast_503_with_its_reason_and_the_service_recovers(stack: Stack) -> None:
    """Past serving.max_in_flight, /predict answers 503 'overloaded' with Retry-After and
    counts it; the probes answer throughout; once the load goes, every request is served."""
    cfg = derived(
        stack.cfg, "the bounded config", serving={"max_in_flight": 2, "retry_after_seconds": 3}
    )
    work = Path(stack.cfg.paths.work_root)
    config = dump_config(cfg, work / "bound.yaml")
    version = stack.services["inprocess"].client.get("/readyz").json()["version"]
    events = stack.pass_events(stack.trained[-1])[:1000]
    _, expected = stack.services["inprocess"].predict(events)
    svc = Service(config, "inprocess", work / "serve-bound.log")
    refused: list[httpx.Response] = []
    others: list[str] = []  # anything but 200 or 503, seen by a client thread
    probes: list[int] = []
    stop = threading.Event()

    # one client for the 12 threads (httpx's is thread-safe): a client each loaded the CA
    # bundle 12 times over, 6 CPU-seconds of this test
    shared = httpx.Client(base_url=svc.url, timeout=30, limits=httpx.Limits(max_connections=12))

    def client() -> None:
        while not stop.is_set():
            r = shared.post("/predict", json={"events": events})
            if r.status_code == 503:
                refused.append(r)
            elif r.status_code != 200:
                others.append(f"{r.status_code} {r.text}")

    try:
        svc.wait_for(version)
        threads = [threading.Thread(target=client) for _ in range(12)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(refused) < 5 and time.monotonic() < deadline:
            probes.append(svc.client.get("/healthz").status_code)
            probes.append(svc.client.get("/readyz").status_code)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not others, others[:3]
        assert len(refused) >= 5, "12 clients of 1,000-event requests never met the bound of 2"
        api = OpenApi(svc.client)
        for r in refused:
            assert r.json()["error"] == "overloaded" and "max_in_flight" in r.json()["detail"]
            assert r.headers["retry-after"] == "3"
            api.check(r)
        assert probes and set(probes) == {200}
        for _ in range(5):  # the load is gone: every request is admitted again
            answered, scores = svc.predict(events)
            assert answered == version
            np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-6)
        metrics = svc.client.get("/metrics").text
        overloaded = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("streamrec_serving_overloaded_total")
        )
        assert overloaded >= len(refused)
        assert 'streamrec_serving_requests_total{code="503",endpoint="predict"}' in metrics
        assert "streamrec_serving_in_flight 0.0" in metrics
    finally:
        stop.set()
        shared.close()
        svc.stop()


def _metric(service: Service, name: str) -> float:
    text = service.client.get("/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name)))


def test_served_events_are_logged_and_kafka_away_costs_no_answer(
    stack: Stack, tmp_path: Path
) -> None:
    """``serving.log_topic``: every answered event is a record on the topic with its
    features as scored, its version and score; with the broker stopped every request is
    still answered at once, what the bounded queue cannot hold is counted, and logging
    goes on when the broker is back. The broker is the test's own, to stop and start."""
    if not stack.trained:
        stack.train_and_deliver(PASSES[0])
    node = KafkaNode("127.0.0.1", (free_port(), free_port()))
    logs = tmp_path / "kafka"
    [broker] = start_kafka_cluster(logs, [node])
    data = stack.cfg.model_dump(mode="json", by_alias=True)
    data["kafka"] |= {"bootstrap_servers": node.address, "partitions": 1}
    data["serving"] |= {"log_topic": "served", "log_buffer_events": 300}
    config = dump_config(PipelineConfig.model_validate(data), tmp_path / "logged.yaml")
    events = [{k: v for k, v in e.items() if k != "event_id"} for e in stack.pass_events(PASSES[1])]
    service = Service(config, "inprocess", tmp_path / "serve.log")
    try:
        service.wait_for(delivery.registry_for(stack.cfg).serving_version())
        first = service.client.post("/predict", json={"events": events[:100]}).json()
        assert all(isinstance(i, str) and len(i) == 32 for i in first["event_ids"])  # assigned
        deadline = time.monotonic() + 30
        while _metric(service, "streamrec_serving_logged_total") < 100:
            assert time.monotonic() < deadline, "nothing was logged"
            time.sleep(0.1)
        records = read_topic(node.address, "served", 1)
        assert [r["event_id"] for r in records] == first["event_ids"]
        assert [r["served"]["p"]["click"] for r in records] == pytest.approx(first["p_click"])
        assert {r["served"]["version"] for r in records} == {first["version"]}
        assert records[0]["dense"] == {
            d.name: float(events[0]["dense"][d.name]) for d in stack.cfg.feature_schema.dense
        }

        broker.stop()  # Kafka away: answers as before, the queue fills, the rest is counted
        started = time.monotonic()
        for i in range(100, 900, 100):
            r = service.client.post("/predict", json={"events": events[i : i + 100]})
            assert r.status_code == 200
        assert time.monotonic() - started < 10  # no request waited on Kafka
        time.sleep(1.0)
        unlogged = _metric(service, "streamrec_serving_unlogged_total")
        backlog = _metric(service, "streamrec_serving_log_backlog")
        assert unlogged == 800 - backlog and backlog == 300, (unlogged, backlog)

        broker = restart_kafka_node(logs, 1, [node])  # back: the queue drains, logging goes on
        service.client.post("/predict", json={"events": events[900:1000]})
        deadline = time.monotonic() + 60
        while _metric(service, "streamrec_serving_log_backlog") > 0:
            assert time.monotonic() < deadline, "the queue did not drain"
            time.sleep(0.2)
        logged = _metric(service, "streamrec_serving_logged_total")
        unlogged = _metric(service, "streamrec_serving_unlogged_total")
        records = read_topic(node.address, "served", 1)
        # every answered event is logged once or counted; some of the queue's came through
        assert logged + unlogged == 1000 and len({r["event_id"] for r in records}) == logged
        assert len(records) == logged and logged > 100 + 100
        # streamrec status tells the same of this replica (its note is renewed every ~3 s)
        deadline = time.monotonic() + 15
        while True:
            status = subprocess.run(
                [STREAMREC, "status", "--config", str(config), "--json"],
                capture_output=True,
                text=True,
            )
            replicas = json.loads(status.stdout)["serving"]["replicas"]
            if any(r.get("unlogged") == unlogged for r in replicas):
                break
            assert time.monotonic() < deadline, replicas
            time.sleep(0.5)
    finally:
        service.stop()
        broker.stop()


def test_sigterm_during_an_overload_stops_within_the_grace(stack: Stack, tmp_path: Path) -> None:
    """``streamrec serve`` unbounded (``max_in_flight`` 1,000,000, bench/serving.py's
    baseline) and overloaded by h2load with 1,000-event requests, then SIGTERM: it exits
    130 within ``serving.shutdown_grace_seconds``; every request h2load got an answer to was
    answered 200, or 503 ``shutting_down``; every event answered is logged or counted. Before
    issue 57 Paddle Inference's glog handler took SIGTERM: the process died at once with a
    C++ "FatalError", or, under load, hung in the handler for good."""
    if not stack.trained:
        stack.train_and_deliver(PASSES[0])
    # 64 requests of 1,000 events in flight take ~2.5 s to score here: a grace of 0.5 s
    # answers some and refuses the rest
    grace, topic = 0.5, f"served-stop-{uuid.uuid4().hex[:8]}"
    data = stack.cfg.model_dump(mode="json", by_alias=True)
    data["serving"] |= {
        "max_in_flight": 1_000_000,
        "shutdown_grace_seconds": grace,
        "log_topic": topic,
    }
    config = dump_config(PipelineConfig.model_validate(data), tmp_path / "stop.yaml")
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"events": stack.pass_events(PASSES[1])[:1000]}))
    requests = tmp_path / "requests.tsv"
    service = Service(config, "inprocess", tmp_path / "serve.log")
    load = None
    try:
        service.wait_for(delivery.registry_for(stack.cfg).serving_version())
        load = subprocess.Popen(
            [
                *(shutil.which("h2load") or "h2load", "--h1", "-c", "64", "-t", "1", "-m", "1"),
                *("-n", "1000000", "--log-file", str(requests), "-d", str(body)),
                *("-H", "content-type: application/json", f"{service.url}/predict"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        time.sleep(5)  # 64 requests of 1,000 events in flight at every moment
        assert load.poll() is None, load.communicate()[0]
        signalled = time.monotonic()
        service.proc.send_signal(signal.SIGTERM)
        code = service.proc.wait(timeout=grace + 30)
        took = time.monotonic() - signalled
        output = load.communicate(timeout=60)[0]
    finally:
        if load is not None and load.poll() is None:
            load.kill()
        service.stop()
    text = service.log.read_text()
    assert code == 130, text[-3000:]
    assert took < grace + 2, (took, text[-3000:])
    assert "FatalError" not in text and "Termination signal" not in text
    statuses = Counter(line.split("\t")[1] for line in requests.read_text().splitlines() if line)
    assert set(statuses) <= {"200", "503"} and statuses["200"] > 0, (statuses, output[-2000:])
    stopped = re.search(
        r"stopped ([\d.]+) s after the signal: (\d+) requests refused as it stopped; "
        r"served log: (\d+) logged, (\d+) could not be",
        text,
    )
    assert stopped is not None, text[-3000:]
    refused, logged, unlogged = (int(stopped[i]) for i in (2, 3, 4))
    assert statuses["503"] == refused > 0
    assert logged + unlogged == 1000 * statuses["200"]
    served = read_topic(stack.cfg.kafka.bootstrap_servers, topic, stack.cfg.kafka.partitions)
    assert len(served) == logged


def test_passes_cut_from_the_served_log_train_what_was_served(stack: Stack, tmp_path: Path) -> None:
    """``passes.cut_from: served_log``: the passes are cut from
    what ``streamrec serve`` scored, clicks joined to it by event id, so a producer's own
    copy of an impression with other features never reaches training."""
    if not stack.trained:
        stack.train_and_deliver(PASSES[0])
    suffix = uuid.uuid4().hex[:8]
    served_topic, clicks_topic = f"served-{suffix}", f"served-clicks-{suffix}"
    data = stack.cfg.model_dump(mode="json", by_alias=True)
    data["passes"]["cut_from"] = "served_log"
    data["join"] |= {"mode": "click_join", "clicks_topic": clicks_topic, "label_window_seconds": 5}
    data["serving"]["log_topic"] = served_topic
    data["passes"] |= {
        "pass_seconds": 60,
        "allowed_lateness_seconds": 1,
        "idle_partition_seconds": 2,
    }
    data["paths"]["data_root"] = str(tmp_path / "served-data")
    cfg = PipelineConfig.model_validate(data)
    config = dump_config(cfg, tmp_path / "served.yaml")
    events = stack.pass_events(PASSES[1])[:200]
    ids = [f"srv-{suffix}-{i}" for i in range(len(events))]
    service = Service(config, "inprocess", tmp_path / "serve.log")
    try:
        service.wait_for(delivery.registry_for(stack.cfg).serving_version())
        body = {"events": [{**e, "event_id": i} for e, i in zip(events, ids, strict=True)]}
        answer = service.client.post("/predict", json=body).json()
        deadline = time.monotonic() + 30
        while _metric(service, "streamrec_serving_logged_total") < len(ids):
            assert time.monotonic() < deadline, "the served events were not logged"
            time.sleep(0.1)
    finally:
        service.stop()
    served = read_topic(cfg.kafka.bootstrap_servers, served_topic, cfg.kafka.partitions)
    ensure_topic(cfg.kafka, clicks_topic, cfg.kafka.partitions)  # as the served log's
    producer = make_producer(cfg.kafka)
    clicked = set(ids[::3])
    now = int(time.time() * 1000)
    for event_id in sorted(clicked):
        producer.send(
            clicks_topic,
            key=event_id.encode(),
            value=json.dumps({"event_id": event_id, "click_time": now}).encode(),
        )
    # a producer's own copy of each impression, other features, on the topic it used before
    for event_id in ids:
        rogue = {"event_id": event_id, "event_time": now, "sparse": {"user_id": "rogue"}}
        producer.send(
            stack.cfg.kafka.impressions_topic,
            key=event_id.encode(),
            value=json.dumps(rogue).encode(),
        )
    # a later impression moves the event time on, so the served minute closes now
    tick = {"event_id": f"tick-{suffix}", "event_time": now + 120_000, "sparse": {}}
    producer.send(served_topic, key=b"tick", value=json.dumps(tick).encode())
    producer.flush()
    producer.close()
    windows = sorted({PassClock(60).id_at(r["event_time"]) for r in served})
    done = subprocess.run(
        [STREAMREC, "build-passes", "--config", str(config), "--until-pass", windows[-1]],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {}
    for pass_id in windows:
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            for row in pq.read_table(directory / part.file).to_pylist():
                assert row["event_id"] not in rows
                rows[row["event_id"]] = row
    assert set(rows) == set(ids) == set(answer["event_ids"])
    by_id = {r["event_id"]: r for r in served}
    for event_id, row in rows.items():
        assert row["label"] == (event_id in clicked)
        sparse = by_id[event_id]["sparse"]
        assert {s.name: row[s.name] for s in cfg.feature_schema.sparse} == sparse
        assert row["user_id"] != "rogue"
