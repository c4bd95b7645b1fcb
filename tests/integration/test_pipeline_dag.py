"""The whole pipeline on real services, driven by the Airflow DAG with ``dag.test()``.

Produce 3 synthetic passes (plus malformed events) to the broker, build passes with a real
consumer, start a fleetrun cluster (1 server + 2 workers), then run ``streamrec_pass`` once
per pass window. The tests read what the runs left behind.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from serving_export import delivery
from serving_export.artifact import verify_artifact
from serving_export.predictor import Predictor
from streaming.pass_builder import PassBuilder
from streaming.producer import (
    make_producer,
    messages_for,
    send_events,
    send_messages,
    synthetic_passes,
)
from streaming.synthetic import SyntheticBatch
from streaming.topics import ensure_topic
from streamrec.config import PipelineConfig, dump_config
from streamrec.passes import parse_pass_id, pass_dir, read_manifest
from trainers.launcher import LocalCluster
from trainers.metrics import exact_auc

# the thread method: dag.test() runs Airflow's task timeouts on SIGALRM (pyproject.toml)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180, method="thread")]

FIRST_PASS = "202603010000"
PASSES = 3
MALFORMED = [
    b"{not json",
    b'{"event_id": "x", "label": 1}',
    b'{"event_id": "y", "event_time": 1772323200500, "label": 0, "dense": {"price": NaN}}',
    b"[]",
    b"",
]


def observed(stack: Stack, pass_id: str) -> np.ndarray:
    """Labels of a pass as the click join sees them."""
    return stack.batches[pass_id].labels_within(stack.cfg.join.label_window_seconds * 1000)


@dataclass
class Stack:
    cfg: PipelineConfig
    cluster: LocalCluster
    batches: dict[str, SyntheticBatch]
    runs: dict[str, object]
    pass_ids: list[str]


def _airflow_db_migrate(env: dict[str, str]) -> None:
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run(
        [airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600
    )


def _window_end(cfg: PipelineConfig, pass_id: str) -> datetime:
    """A manual run (``dag.test``, a UI trigger) covers the window that ends at its date."""
    return parse_pass_id(pass_id) + timedelta(seconds=cfg.passes.clock.seconds)


def _task_states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


@pytest.fixture(scope="module")
def stack(make_config) -> Stack:
    # every pass is complete before the first run: with catch-up on, that run would train
    # them all and deliver the newest (test_airflow_scheduler.py checks that); here each
    # run delivers its own pass, as when the DAG keeps up
    cfg = make_config(
        synthetic={"events_per_pass": 20000},
        schedule={"catchup_passes": 0},
        # separate progressive metrics: test_predictor_scores_like_the_cluster compares them
        # with the exported model of the pass before
        model={"runner": {"progressive": "separate"}},
    )
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    assert cfg.join.mode == "click_join"  # the shipped config: labels come from clicks
    for topic in (cfg.kafka.impressions_topic, cfg.join.clicks_topic):
        ensure_topic(cfg.kafka, topic, cfg.kafka.partitions)
    producer = make_producer(cfg.kafka)
    batches = dict(synthetic_passes(cfg, FIRST_PASS, PASSES))
    for i, batch in enumerate(batches.values()):
        send_messages(producer, messages_for(cfg, batch))
        if i == 0:
            send_events(producer, cfg.kafka.impressions_topic, MALFORMED)
    producer.close()
    pass_ids = list(batches)[:PASSES]

    builder = PassBuilder(cfg)
    stop = threading.Event()
    thread = threading.Thread(target=builder.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    cluster = LocalCluster(cfg, resolved)
    cluster.start()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("STREAMREC_CONFIG", str(resolved))  # undone after the module's tests
            _airflow_db_migrate(dict(os.environ))
            from airflow.dag_processing.dagbag import DagBag

            bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
            assert not bag.import_errors, bag.import_errors
            dag = bag.get_dag("streamrec_pass")
            runs = {p: dag.test(logical_date=_window_end(cfg, p)) for p in pass_ids}
            yield Stack(cfg, cluster, batches, runs, pass_ids)
    finally:
        cluster.stop()
        stop.set()
        thread.join(30)
        builder.close()


def test_every_pass_ran_through_the_dag(stack: Stack) -> None:
    for pass_id, run in stack.runs.items():
        assert str(run.state) == "success", (pass_id, _task_states(run))
        trained = stack.cluster.client.pass_status(pass_id).train
        assert trained is not None and trained.pass_id == pass_id


def test_second_pass_global_auc_is_above_0_6(stack: Stack) -> None:
    second = stack.cluster.client.pass_status(stack.pass_ids[1]).train
    assert second is not None and second.test.auc > 0.6, second
    best = exact_auc(
        stack.batches[stack.pass_ids[1]].probabilities, observed(stack, stack.pass_ids[1])
    )
    assert second.test.auc < best + 0.02  # nothing beats the generating model


def test_both_workers_report_the_same_global_auc(stack: Stack) -> None:
    for pass_id in stack.pass_ids:
        per_worker = stack.cluster.client.worker_results("train", pass_id)
        assert sorted(per_worker) == [0, 1]
        assert per_worker[0]["test"] == per_worker[1]["test"]
        assert per_worker[0]["train"] == per_worker[1]["train"]


def test_every_row_is_evaluated_once_and_bad_events_are_counted(stack: Stack) -> None:
    total_malformed = 0
    for pass_id in stack.pass_ids:
        manifest = read_manifest(pass_dir(stack.cfg.paths.data_root, pass_id))
        train = stack.cluster.client.pass_status(pass_id).train
        assert train is not None and manifest.rows == len(stack.batches[pass_id].events)
        assert train.test.count == train.train.count == manifest.rows
        assert train.count_matches_manifest
        total_malformed += manifest.counts.malformed_total
    assert total_malformed == len(MALFORMED)


def test_gate_decides_what_is_delivered(stack: Stack) -> None:
    registry = delivery.registry_for(stack.cfg)
    passed = []
    for pass_id, run in stack.runs.items():
        gate = stack.cluster.client.pass_status(pass_id).gate
        states = _task_states(run)
        assert gate is not None, pass_id
        if gate.passed:
            passed.append(pass_id)
            assert states["deliver"] == "success"
        else:
            assert gate.auc < stack.cfg.gate.min_auc or gate.reasons
            assert states["export"] == states["deliver"] == "skipped"
    assert passed, "no pass was delivered"
    assert registry.serving_version() == passed[-1]
    assert registry.versions() == sorted(passed)


def test_checkpoint_saved_for_every_pass(stack: Stack) -> None:
    """A base for the first pass, then one delta per pass on top of it, each recorded with
    the pass's train result."""
    root = Path(stack.cfg.paths.checkpoint_root)
    kinds = ["base"] + ["delta"] * (len(stack.pass_ids) - 1)
    parent = None
    for pass_id, kind in zip(stack.pass_ids, kinds, strict=True):
        path = root / f"{pass_id}-{kind}"
        info = json.loads((path / "CHECKPOINT.json").read_text())
        assert (info["pass_id"], info["kind"], info["parent"]) == (pass_id, kind, parent)
        trained = stack.cluster.client.pass_status(pass_id).train
        assert trained is not None and info["train"]["rows"] == trained.rows
        tables = [d for d in path.iterdir() if d.is_dir()]
        assert tables and all(any(t.iterdir()) for t in tables)
        assert 0 < info["saved_keys"] <= info["table_keys"]
        parent = path.name


def test_predictor_scores_like_the_cluster(stack: Stack) -> None:
    """The artifact of pass 2 scored on pass 3 gives the AUC the cluster measured on pass 3
    before training on it (same model state): training and serving agree."""
    second, third = stack.pass_ids[1], stack.pass_ids[2]
    gate = stack.cluster.client.pass_status(second).gate
    if gate is None or not gate.passed:
        pytest.fail("pass 2 was not delivered; its AUC is asserted above 0.6 elsewhere")
    artifact = Path(stack.cfg.paths.model_root) / stack.cfg.model.model / second
    verify_artifact(artifact)
    scores = Predictor(artifact).score(stack.batches[third].events)
    assert np.all(np.isfinite(scores)) and np.all((scores > 0) & (scores < 1))
    trained = stack.cluster.client.pass_status(third).train
    assert trained is not None
    assert abs(exact_auc(scores, observed(stack, third)) - trained.test.auc) < 0.003
    assert math.isclose(float(scores.mean()), trained.test.predicted_ctr, rel_tol=1e-3)


def test_rerunning_a_pass_does_not_train_it_again(stack: Stack) -> None:
    from airflow.dag_processing.dagbag import DagBag

    pass_id = stack.pass_ids[1]
    before = stack.cluster.client.pass_status(pass_id)
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag(
        "streamrec_pass"
    )
    run = dag.test(logical_date=_window_end(stack.cfg, pass_id))
    assert str(run.state) == "success", _task_states(run)
    after = stack.cluster.client.pass_status(pass_id)
    assert after.train == before.train
    assert after.gate == before.gate  # judged once, not against a newer model
    assert delivery.registry_for(stack.cfg).serving_version() == stack.pass_ids[-1]
    again = stack.cluster.client.train(pass_id)
    assert again.already_done is True
    assert before.train is not None and again.test == before.train.test
