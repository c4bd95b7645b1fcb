"""Wide&Deep and DeepFM on the real cluster: they learn the synthetic stream, and the
artifact exported after pass 1 scores pass 2 as the cluster did before training on it: the
single-process metrics of the artifact's scores equal the cluster's all-reduced ones (the
serving path handles every model; the distributed metrics are those of one process), and
its ONNX export scores the same on onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving_export import delivery
from serving_export.predictor import Predictor
from streamrec.auc import exact_auc
from streamrec.config import dump_config
from trainers.launcher import LocalCluster
from trainers.metrics import metrics_from_stats, stats_from_predictions
from trainers.models import AUC_BUCKETS

FIRST = "202609010000"


@pytest.mark.parametrize("model", ["wide_deep", "deepfm"])
def test_model_learns_and_serves_like_the_cluster(make_config, build_passes, model: str):
    cfg = make_config(
        join={"mode": "label_in_impression"},
        synthetic={"events_per_pass": 12000},
        # separate progressive metrics: the model as the first pass left it scores the
        # second, as the exported model does (in_train's would include learning in the pass)
        model={"model": model, "runner": {"progressive": "separate"}},
    )
    batches = build_passes(cfg, FIRST, 2)
    first, second = list(batches)[:2]
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        trained = cluster.client.train(first)
        raw = cluster.client.export(first).raw_export
        scored = cluster.client.train(second)
    assert scored.test.auc > 0.65, scored.test
    manifest = delivery.publish(cfg, raw, delivery.evaluate(cfg, trained))
    predictor = Predictor(Path(cfg.paths.model_root) / model / manifest.version)
    events = batches[second].events
    scores = predictor.score(events)
    labels = np.array([e["label"] for e in events])
    assert abs(exact_auc(scores, labels) - scored.test.auc) < 0.003
    single = metrics_from_stats(*stats_from_predictions(scores, labels, AUC_BUCKETS)).to_dict()
    assert single["count"] == scored.test.count
    for name, value in single.items():  # float32 inference on both sides, summed differently
        assert getattr(scored.test, name) == pytest.approx(value, rel=1e-4, abs=1e-5), name
    # the ONNX twin of the dense program scores the same events on onnxruntime
    assert manifest.onnx.file == "model.onnx", manifest.onnx
    onnx = Predictor(predictor.directory, predictor.embeddings, runtime="onnx")
    np.testing.assert_allclose(onnx.score(events), scores, rtol=0, atol=1e-5)
