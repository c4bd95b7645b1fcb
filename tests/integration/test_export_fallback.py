"""Export for any network: a network with an operator the ONNX converter lacks trains,
exports and serves. The converter aborts in a child of the exporting worker, not the worker
(it trains on after the export); the artifact has the Paddle program alone and its manifest
says why; ``streamrec serve --runtime onnx`` scores it on Paddle, equal to the cluster's own
inference to 1e-5."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_cluster import cli_cluster, cli_json
from pass_rows import cluster_scores, pass_events
from serve_process import Service

from serving_export.delivery import evaluate
from streamrec.config import PipelineConfig, dump_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OUTSIDE = Path(__file__).parent / "outside"
FIRST = "202609200000"


def _network(make_config) -> PipelineConfig:
    cfg = make_config(
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 3000},
        gate={"min_auc": 0.0, "max_auc_drop": 1.0, "min_rows": 1},
    )
    data = cfg.model_dump(mode="json", by_alias=True)
    hp = data["model"]["hyper_parameters"]
    data["model"].update(model="soft", network="odd_nets:SoftRanked")
    data["model"]["hyper_parameters"] = {
        k: hp[k] for k in ("sparse_feature_dim", "optimizer", "sparse_table")
    }
    return PipelineConfig.model_validate(data)


def test_a_network_onnx_cannot_take_ships_and_serves_on_paddle(make_config, build_passes) -> None:
    cfg = _network(make_config)
    passes = list(build_passes(cfg, FIRST, 3))[:3]
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with cli_cluster(config, env={"PYTHONPATH": str(OUTSIDE)}) as client:
        trained = client.train(passes[0])
        raw = client.export(passes[0]).raw_export
        workers = {w.rank for w in client.live_workers()}
        expected = cluster_scores(client, passes[1], pass_events(cfg, passes[1]))
        assert client.train(passes[1]).test.count > 0  # the workers train on after it
        assert {w.rank for w in client.live_workers()} == workers
    spec = json.loads((Path(raw) / "export_spec.json").read_text())
    assert spec["onnx"]["file"] is None and "logcumsumexp" in spec["onnx"]["error"], spec["onnx"]
    assert not list(Path(raw).glob("*.onnx"))

    evaluate(cfg, trained)
    version = cli_json("publish", "--config", str(config), "--raw-export", raw)["version"]
    cli_json("deliver", "--config", str(config), "--version", version)
    artifact = Path(cfg.paths.model_root) / "soft" / version
    manifest = json.loads((artifact / "MANIFEST.json").read_text())
    assert manifest["onnx"]["file"] is None and "logcumsumexp" in manifest["onnx"]["error"]
    assert not list(artifact.glob("*.onnx"))

    events = pass_events(cfg, passes[1])
    served = Service(config, "inprocess", Path(cfg.paths.work_root) / "serve.log", runtime="onnx")
    try:
        served.wait_for(version)
        about = served.client.get("/version").json()
        assert about["runtime"] == "paddle" and about["network"] == "odd_nets:SoftRanked"
        got = np.concatenate(
            [served.predict(events[i : i + 500])[1] for i in range(0, len(events), 500)]
        )
    finally:
        served.stop()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
