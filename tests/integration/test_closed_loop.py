"""The closed loop through the entry points a team runs, on real parts (Apache Kafka,
redis-server, a fleetrun cluster, uvicorn): ``streamrec serve`` logs what it scored,
``streamrec build-passes`` cuts passes from that log with the clicks joined by event id, the
cluster trains them and the next version is delivered; ``streamrec status`` and
``streamrec online`` give each served version's online metrics, and a deliberately
degraded version is withdrawn and rolled back by the online alarm; on canary, a better
candidate is promoted and a degraded one withdrawn before it ever serves.

The degraded version is honest training, on lies: after two passes of the synthetic
stream, three passes whose clicks are inverted (clicked impressions get none, the others
one). While it serves, ``serving.holdout_share`` 0.5 keeps its predecessor answering half
the requests (``serving.canary_share`` 0.5: the candidate answers half), so the two are
compared on the same minutes of traffic.

Why the bars hold: 2,000 events go in 200 requests of 10, each request to one version at
random, so each version answers about 1,000 labelled events (never under 400, the
``online.min_events`` here, but with odds below 1e-15), some 150 of them clicked. AUC's
standard error is then about sqrt(AUC (1 - AUC) / min(clicks, non-clicks)) ~ 0.035 per
version, ~0.05 for the difference of two. The inverted version is some 0.5 below its
predecessor (a run here: 0.241 against 0.756), so the alarm's margin of 0.05 is crossed by
nine times that error. The canary's bar is 0.2, four times it: a candidate trained on
more of the same stream (a run here: 0.742 against the serving one's 0.756) is withdrawn
by chance about once in 30,000 runs, while the inverted candidate (0.229 against 0.757)
is six times the error past it.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import dataclass, replace
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
from streamrec.passes import pass_dir, read_manifest
from trainers.launcher import LocalCluster
from trainers.metrics import exact_auc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FIRST = "202610010000"
LIVE = 2000  # events scored by the service in one round


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


def _metric(service: Service, name: str, version: str | None = None) -> float | None:
    for line in service.client.get("/metrics").text.splitlines():
        if version is None and line.startswith(f"{name} "):
            return float(line.split()[1])
        if line.startswith(f"{name}{{") and f'version="{version}"' in line:
            return float(line.split()[-1])
    return None


def _produce_and_build(cfg: PipelineConfig, config: Path) -> list[str]:
    """Two passes of the stream, then three with their clicks inverted, on the topics the
    pipeline reads (impressions with no served field: scored by no service), built into
    passes; their ids."""
    batches = list(synthetic_passes(cfg, FIRST, 5))
    ensure_event_topics(cfg)
    producer = make_producer(cfg.kafka)
    for i, (_, batch) in enumerate(batches):
        send_messages(producer, messages_for(cfg, _inverted(batch) if 2 <= i < 5 else batch))
    producer.close()
    boot = [pass_id for pass_id, _ in batches[:5]]
    _build(config, boot[-1])
    return boot


def _answering(cfg: PipelineConfig, field: str, version: str | None) -> None:
    """Wait until a service notes ``version`` as the one answering its ``field`` share
    (held, canary)."""
    registry = delivery.registry_for(cfg)
    deadline = time.monotonic() + 30
    while not any(getattr(n, field) == version for n in registry.replicas()):
        assert time.monotonic() < deadline, registry.replicas()
        time.sleep(0.2)


@dataclass
class Round:
    """One round of live traffic: what answered each event, and the passes it went to."""

    truth: dict[str, int]  # event id -> clicked
    answered: dict[str, str]  # event id -> the version that scored it
    windows: list[str]
    rows: list[dict[str, Any]]

    def joined(self, version: str) -> tuple[np.ndarray, np.ndarray]:
        """The served probabilities and joined labels of the rows ``version`` answered."""
        mine = [r for r in self.rows if r["served_version"] == version]
        return np.array([r["served_p_click"] for r in mine]), np.array([r["label"] for r in mine])


def _serve_round(cfg: PipelineConfig, config: Path, service: Service, name: str) -> Round:
    """``LIVE`` events of the stream's own world scored by ``service`` and logged; their
    clicks (half a second after each was served) and a tick that closes their windows;
    the passes built from the served log. Every served event is checked to be in exactly
    one pass, with its click and the version that scored it."""
    logged = _metric(service, "streamrec_serving_logged_total") or 0
    now = int(time.time() * 1000)
    live = SyntheticStream(cfg.feature_schema, cfg.synthetic).batch(now, now + 1, LIVE)
    truth: dict[str, int] = {}
    answered: dict[str, str] = {}
    for i in range(0, LIVE, 10):  # 200 requests: each version gets ~100 of them, >= 40
        chunk = []
        for k, e in enumerate(live.events[i : i + 10], start=i):
            event_id = f"{name}-{k}"
            truth[event_id] = int(live.labels[k])
            chunk.append({"event_id": event_id, "sparse": e["sparse"], "dense": e["dense"]})
        answer = service.client.post("/predict", json={"events": chunk}).json()
        answered |= dict.fromkeys(answer["event_ids"], answer["version"])
    deadline = time.monotonic() + 30
    while (_metric(service, "streamrec_serving_logged_total") or 0) < logged + LIVE:
        assert time.monotonic() < deadline, "the served events were not all logged"
        time.sleep(0.2)
    topic = cfg.kafka.impressions_topic
    served = [
        r
        for r in read_topic(cfg.kafka.bootstrap_servers, topic, cfg.kafka.partitions)
        if r["event_id"] in truth
    ]
    assert {r["event_id"]: r["served"]["version"] for r in served} == answered
    clicks = [
        (cfg.join.clicks_topic, {"event_id": r["event_id"], "click_time": r["event_time"] + 500})
        for r in served
        if truth[r["event_id"]]
    ]
    clock = cfg.passes.clock
    windows = sorted({clock.id_at(r["event_time"]) for r in served})
    closed_at = clock.window(windows[-1])[1] + 12_000  # past lateness and the label window
    tick = {"event_id": f"{name}-tick", "event_time": closed_at, "sparse": {}}
    producer = make_producer(cfg.kafka)
    send_messages(producer, [*clicks, (topic, tick)])
    producer.close()
    _build(config, windows[-1])
    rows = []
    for pass_id in windows:
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            rows += [r for r in pq.read_table(directory / part.file).to_pylist()]
    rows = [r for r in rows if r["event_id"] in truth]
    assert sorted(r["event_id"] for r in rows) == sorted(truth)
    assert all(r["label"] == truth[r["event_id"]] for r in rows)
    assert all(r["served_version"] == answered[r["event_id"]] for r in rows)
    return Round(truth, answered, windows, rows)


def _config_for(
    make_config, tmp_path: Path, serving: dict, online: dict
) -> tuple[PipelineConfig, Path]:
    cfg = make_config(
        join={"mode": "click_join", "label_window_seconds": 10},
        synthetic={"events_per_pass": 4000, "click_delay_seconds": 2},
        # 20 s windows: the second round waits for the first one's last window to end
        passes={"pass_seconds": 20, "allowed_lateness_seconds": 1, "idle_partition_seconds": 2},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
    )
    cfg = derived(
        cfg,
        "passes cut from the served log",
        passes={"cut_from": "served_log"},
        serving={
            "sparse_store": "inprocess",
            "poll_seconds": 0.1,
            "log_topic": cfg.kafka.impressions_topic,
            **serving,
        },
        online={"min_events": 400, "windows": 20, **online},
    )
    return cfg, dump_config(cfg, tmp_path / "pipeline.yaml")


def test_served_traffic_trains_once_is_judged_per_version_and_a_worse_one_rolls_back(
    make_config, tmp_path: Path
) -> None:
    cfg, config = _config_for(
        make_config, tmp_path, {"holdout_share": 0.5}, {"rollback": True, "max_auc_drop": 0.05}
    )
    boot = _produce_and_build(cfg, config)
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
            _answering(cfg, "held", good)  # the predecessor loaded for the holdout share
            live = _serve_round(cfg, config, service, f"live-{uuid.uuid4().hex[:8]}")
            assert set(live.answered.values()) == {good, bad}

            # online metrics per version equal numpy's on the same joined rows
            status = _cli(config, "status", "--json")["serving"]
            online = {m["version"]: m for m in status["online"] if m["task"] == "click"}
            auc = {}
            for version in (good, bad):
                p, y = live.joined(version)
                q = np.clip(p, 1e-7, 1 - 1e-7)
                m = online[version]
                assert m["count"] == len(p) and m["windows"] == live.windows
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
            for pass_id in live.windows:
                done = run_pass(cfg, cluster.client, pass_id)
                assert done.train.count_matches_manifest
                trained += done.train.rows
            assert trained == LIVE
            assert registry.serving_version() == live.windows[-1] != bad
            service.wait_for(live.windows[-1])
            again = _cli(config, "online")
            assert again["withdrawn"] is None  # too few events of the new one to judge yet
        finally:
            service.stop()


def test_a_candidate_on_canary_is_promoted_when_as_good_and_withdrawn_when_worse(
    make_config, tmp_path: Path
) -> None:
    cfg, config = _config_for(make_config, tmp_path, {"canary_share": 0.5}, {"max_auc_drop": 0.2})
    boot = _produce_and_build(cfg, config)
    registry = delivery.registry_for(cfg)
    with LocalCluster(cfg, config) as cluster:
        first = run_pass(cfg, cluster.client, boot[0]).version  # nothing served: it serves
        run_pass(cfg, cluster.client, boot[1])  # a candidate, not serving yet
        assert (registry.serving_version(), registry.candidate()) == (first, boot[1])
        service = Service(config, "inprocess", tmp_path / "serve.log")
        try:
            service.wait_for(first)
            _answering(cfg, "canary", boot[1])
            one = _serve_round(cfg, config, service, f"one-{uuid.uuid4().hex[:8]}")
            assert set(one.answered.values()) == {first, boot[1]}
            checked = _cli(config, "online")  # trained on more of the same: not worse
            assert checked["promoted"] == boot[1], checked
            print("promoted:", checked["comparison"])
            assert (registry.serving_version(), registry.candidate()) == (boot[1], None)
            service.wait_for(boot[1])
            _answering(cfg, "canary", None)

            cluster.client.train(boot[2])
            cluster.client.train(boot[3])
            run_pass(cfg, cluster.client, boot[4])  # inverted clicks: on canary only
            assert (registry.serving_version(), registry.candidate()) == (boot[1], boot[4])
            _answering(cfg, "canary", boot[4])
            # the next round's events must fall after the last window the first round closed
            while time.time() * 1000 < cfg.passes.clock.window(one.windows[-1])[1] + 500:
                time.sleep(0.5)
            two = _serve_round(cfg, config, service, f"two-{uuid.uuid4().hex[:8]}")
            assert set(two.answered.values()) == {boot[1], boot[4]}
            checked = _cli(config, "online")
            assert checked["withdrawn"] == boot[4], checked
            comparison = checked["comparison"]
            print("withdrawn:", comparison)
            assert comparison["windows"] == two.windows  # only the windows both answered
            assert (registry.serving_version(), registry.candidate()) == (boot[1], None)
            status = _cli(config, "status", "--json")["serving"]
            assert "online click AUC" in status["withdrawn"][boot[4]]["reason"]
            _answering(cfg, "canary", None)  # the service stopped asking it
            # a retried delivery of the withdrawn version does not bring it back
            again = subprocess.run(
                [STREAMREC, "deliver", "--config", str(config), "--version", boot[4]],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert again.returncode == 1 and f"{boot[4]} was withdrawn" in again.stderr
            assert registry.candidate() is None
        finally:
            service.stop()
