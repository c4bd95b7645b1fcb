"""Every model builds a static program over the schema's slots with the same interface:
one sparse_embedding per slot into the shared table, pooled feeds for serving, metric
accumulators, a click probability in (0, 1)."""

from __future__ import annotations

import pytest

from streamrec.config import PipelineConfig
from trainers.models import MODELS, SPARSE_TABLE


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_builds_with_the_shared_interface(shipped_config: PipelineConfig, name: str):
    import paddle

    schema, hp = shipped_config.feature_schema, shipped_config.model.hyper_parameters
    main, startup = paddle.static.Program(), paddle.static.Program()
    paddle.enable_static()
    try:
        with paddle.static.program_guard(main, startup):
            graph = MODELS[name]().build(schema, hp)
    finally:
        paddle.disable_static()
    ops = [op.type for op in main.global_block().ops]
    lookups = [op for op in main.global_block().ops if op.type.startswith("lookup_table")]
    assert len(lookups) == len(schema.sparse)
    assert {op.input("W")[0] for op in lookups} == {SPARSE_TABLE}
    assert list(graph.pooled) == [s.name for s in schema.sparse]
    assert [v.name for v in graph.use_vars][-1] == "label"
    assert graph.predict.shape[-1] == 1 and "sigmoid" in ops
    assert set(graph.stat_vars) >= {"auc_pos", "auc_neg", "count", "clicks"}
    dense_params = {p.name for p in main.all_parameters()} - {SPARSE_TABLE}
    assert dense_params, "a model with no dense weights"
    if name != "ctr_dnn":  # wide and FM parts read each key's scalar weight (embed_w)
        assert "slice" in ops
