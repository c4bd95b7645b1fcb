"""The closed loop through the entry points a team runs, on real parts (Apache Kafka,
redis-server, a fleetrun cluster, uvicorn): ``streamrec serve`` logs what it scored,
``streamrec build-passes`` cuts passes from that log with the clicks joined by event id, the
cluster trains them and the next version is delivered; ``streamrec status`` and
``streamrec online`` give each served version's online metrics, and a deliberately
degraded version is withdrawn and rolled back by the online alarm.

The degraded version is honest training, on lies: after two passes of the synthetic
stream, three passes whose clicks are inverted (clicked impressions get none, the others
one). While it serves, ``serving.holdout_share`` 0.5 keeps its predecessor answering half
the requests, so the two are compared on the same minutes of traffic.

Why the alarm's bar holds: each version answers about 1,000 labelled events, some 150 of
them clicked. AUC's standard error is then at most sqrt(AUC (1 - AUC) / min(clicks,
non-clicks)) ~ 0.04 per version, ~0.06 for the difference; the predecessor is some 0.2
above chance and the inverted version below it, so a margin of 0.05 is crossed by more
than twice that error. The run below prints both AUCs.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from serve_process import STREAMREC, Service
from topic_reads import read_topic

from ops.pass_sequence import run_pass
from serving_export import delivery
from streaming.producer import (
    ensure_event_topics,
    make_producer,
    messages_for,
    send_messages,
    synthetic_passes,
)
from streaming.synthetic import SyntheticBatch, SyntheticStream
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import compose_pass_id, pass_dir, read_manifest
from trainers.launcher import LocalCluster
from trainers.metrics import exact_auc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FIRST = "202610010000"
LIVE = 2000  # events scored by the service


def _inverted(batch: SyntheticBatch) -> SyntheticBatch:
    """The batch with its clicks inverted: every clicked impression unclicked, every other
    one clicked a second after it was shown."""
    shown = np.array([e["event_time"] for e in batch.events])
    clicks = np.where(batch.click_times >= 0, -1, shown + 1000)
    return replace(batch, click_times=clicks, labels=(clicks >= 0).astype(batch.labels.dtype))


def _build(config: Path, until: str) -> None:
    done = subprocess.run(
        [STREAMREC, "build-passes", "--config", str(config), "--until-pass", until],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _cli(config: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [STREAMREC, *args, "--config", str(config)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode in (0, 5), done.stderr[-3000:]  # 5: status says a pass needs care
    return json.loads(done.stdout)


def _metric(service: Service, name: str, version: str) -> float | None:
    for line in service.client.get("/metrics").text.splitlines():
        if line.startswith(f"{name}{{") and f'version="{version}"' in line:
            return float(line.split()[-1])
    return None


@pytest.fixture
def served_cfg(make_config) -> PipelineConfig:
    cfg = make_config(
        join={"mode": "click_join", "label_window_seconds": 10},
        synthetic={"events_per_pass": 4000, "click_delay_seconds": 2},
        passes={"pass_minutes": 1, "allowed_lateness_seconds": 1, "idle_partition_seconds": 2},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
    )
    return derived(
        cfg,
        "passes cut from the served log",
        serving={
            "sparse_store": "inprocess",
            "poll_seconds": 0.1,
            "log_topic": cfg.kafka.impressions_topic,
            "holdout_share": 0.5,
        },
        online={"rollback": True, "min_events": 400, "max_auc_drop": 0.05, "windows": 20},
    )


def test_served_traffic_trains_once_is_judged_per_version_and_a_worse_one_rolls_back(
    served_cfg: PipelineConfig, tmp_path: Path
) -> None:
    cfg = served_cfg
    config = dump_config(cfg, tmp_path / "pipeline.yaml")
    suffix = uuid.uuid4().hex[:8]
    # two passes of the stream, then three with their clicks inverted, on the topics the
    # pipeline reads (impressions without a served field: not scored by a service)
    batches = list(synthetic_passes(cfg, FIRST, 5))
    ensure_event_topics(cfg)
    producer = make_producer(cfg.kafka)
    for i, (_, batch) in enumerate(batches):
        send_messages(producer, messages_for(cfg, _inverted(batch) if 2 <= i < 5 else batch))
    producer.close()
    boot = [pass_id for pass_id, _ in batches[:5]]
    _build(config, boot[-1])
    registry = delivery.registry_for(cfg)
    with LocalCluster(cfg, config) as cluster:
        run_pass(cfg, cluster.client, boot[0])
        good = run_pass(cfg, cluster.client, boot[1]).version
        cluster.client.train(boot[2])
        cluster.client.train(boot[3])
        bad = run_pass(cfg, cluster.client, boot[4]).version
        assert (good, bad) == (boot[1], boot[4]) and registry.predecessor(bad) == good

        service = Service(config, "inprocess", tmp_path / "serve.log")
        try:
            service.wait_for(bad)
            deadline = time.monotonic() + 30  # the predecessor loaded for the holdout share
            while not any(n.held == good for n in registry.replicas()):
                assert time.monotonic() < deadline, registry.replicas()
                time.sleep(0.2)
            # live traffic of the same world, scored by both versions
            now = int(time.time() * 1000)
            live = SyntheticStream(cfg.feature_schema, cfg.synthetic).batch(now, now + 1, LIVE)
            truth = {}
            answered: dict[str, str] = {}
            for i in range(0, LIVE, 50):
                chunk = []
                for k, e in enumerate(live.events[i : i + 50], start=i):
                    event_id = f"live-{suffix}-{k}"
                    truth[event_id] = int(live.labels[k])
                    chunk.append({"event_id": event_id, "sparse": e["sparse"], "dense": e["dense"]})
                answer = service.client.post("/predict", json={"events": chunk}).json()
                answered |= dict.fromkeys(answer["event_ids"], answer["version"])
            assert set(answered.values()) == {good, bad}
            deadline = time.monotonic() + 30
            while (logged := _logged(service)) < LIVE:
                assert time.monotonic() < deadline, f"{logged} of {LIVE} logged"
                time.sleep(0.2)

            # what the service logged, and the clicks on it, half a second after each
            served = [
                r
                for r in read_topic(
                    cfg.kafka.bootstrap_servers, cfg.kafka.impressions_topic, cfg.kafka.partitions
                )
                if r["event_id"].startswith(f"live-{suffix}")
            ]
            assert {r["event_id"]: r["served"]["version"] for r in served} == answered
            clicks = [
                (
                    cfg.join.clicks_topic,
                    {"event_id": r["event_id"], "click_time": r["event_time"] + 500},
                )
                for r in served
                if truth[r["event_id"]]
            ]
            end = max(r["event_time"] for r in served)
            tick = {"event_id": f"tick-{suffix}", "event_time": end + 180_000, "sparse": {}}
            producer = make_producer(cfg.kafka)
            send_messages(producer, [*clicks, (cfg.kafka.impressions_topic, tick)])
            producer.close()
            windows = sorted({compose_pass_id(r["event_time"], 1) for r in served})
            _build(config, windows[-1])

            # every served event in exactly one pass, with its click, beside what scored it
            rows = []
            for pass_id in windows:
                directory = pass_dir(cfg.paths.data_root, pass_id)
                for part in read_manifest(directory).parts:
                    rows += pq.read_table(directory / part.file).to_pylist()
            assert sorted(r["event_id"] for r in rows) == sorted(truth)
            assert all(r["label"] == truth[r["event_id"]] for r in rows)
            assert all(r["served_version"] == answered[r["event_id"]] for r in rows)

            # online metrics per version equal numpy's on the same joined rows
            status = _cli(config, "status", "--json")["serving"]
            online = {m["version"]: m for m in status["online"] if m["task"] == "click"}
            auc = {}
            for version in (good, bad):
                mine = [r for r in rows if r["served_version"] == version]
                p = np.array([r["served_p_click"] for r in mine])
                y = np.array([r["label"] for r in mine])
                q = np.clip(p, 1e-7, 1 - 1e-7)
                m = online[version]
                assert m["count"] == len(mine) and m["windows"] == windows
                assert m["logloss"] == pytest.approx(
                    float(np.mean(-(y * np.log(q) + (1 - y) * np.log(1 - q)))), abs=1e-6
                )
                assert m["copc"] == pytest.approx(float(y.sum() / p.sum()), abs=1e-6)
                assert m["auc"] == pytest.approx(exact_auc(p, y), abs=2e-3)  # bucket width
                auc[version] = m["auc"]
            print(f"online AUC: {good} {auc[good]:.4f}, {bad} (inverted clicks) {auc[bad]:.4f}")

            # the alarm: the worse version is withdrawn, its predecessor serves again
            checked = _cli(config, "online")
            assert checked["withdrawn"] == bad, checked
            assert registry.serving_version() == good
            service.wait_for(good)
            status = _cli(config, "status", "--json")["serving"]
            assert "online click AUC" in status["withdrawn"][bad]["reason"]
            deadline = time.monotonic() + 15  # each answering version's, on /metrics
            while _metric(service, "streamrec_online_auc", good) is None:
                assert time.monotonic() < deadline, service.client.get("/metrics").text[-2000:]
                time.sleep(0.5)
            assert _metric(service, "streamrec_online_auc", good) == pytest.approx(auc[good])

            # the loop goes on: the served passes train once each, the next version serves
            trained = 0
            for pass_id in windows:
                done = run_pass(cfg, cluster.client, pass_id)
                assert done.train.count_matches_manifest
                trained += done.train.rows
            assert trained == LIVE
            assert registry.serving_version() == windows[-1] != bad
            service.wait_for(windows[-1])
            again = _cli(config, "online")
            assert again["withdrawn"] is None  # too few events of the new one to judge yet
        finally:
            service.stop()


def _logged(service: Service) -> float:
    for line in service.client.get("/metrics").text.splitlines():
        if line.startswith("streamrec_serving_logged_total"):
            return float(line.split()[1])
    return 0.0
