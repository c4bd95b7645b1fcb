"""The program around a network (``trainers.models``) and the model API's loader: every
shipped network builds through the API with the shared interface; pooling modes and
sequences reach a network as the API says; a network that cannot be imported, takes a bad
hyper-parameter or returns the wrong shape fails with a ConfigError naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from streamrec.config import DEFAULT_SPARSE_TABLE, PipelineConfig, derived, load_config
from streamrec.errors import ConfigError
from streamrec.network import LOGIT_BIAS, SHIPPED, NetworkInputs
from trainers.models import ModelGraph, build_model
from trainers.network_loader import SHIPPED_NETWORKS, network_path


def _build(cfg: PipelineConfig) -> ModelGraph:
    return build_model(cfg.feature_schema, cfg.model)


def test_every_shipped_name_has_its_network() -> None:
    """The config accepts exactly the names the cluster can build (the core names them,
    the trainers own the classes)."""
    assert sorted(SHIPPED_NETWORKS) == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_network_builds_with_the_shared_interface(
    shipped_config: PipelineConfig, static_program: Any, name: str
) -> None:
    cfg = derived(shipped_config, "test", model={"model": name})
    graph = _build(cfg)
    schema = cfg.feature_schema
    ops = [op.type for op in static_program.global_block().ops]
    lookups = [op for op in static_program.global_block().ops if op.type.startswith("lookup_table")]
    assert len(lookups) == len(schema.sparse)
    assert {op.input("W")[0] for op in lookups} == {DEFAULT_SPARSE_TABLE}
    assert list(graph.pooled) == [s.name for s in schema.sparse] and graph.sequences == {}
    assert [v.name for v in graph.use_vars][-1] == "label"
    assert graph.predict.shape[-1] == 1 and "sigmoid" in ops
    assert set(graph.main.stat_vars) >= {"auc_pos", "auc_neg", "count", "clicks"}
    params = {p.name for p in static_program.all_parameters()}
    assert LOGIT_BIAS in params and graph.main.logit_bias == LOGIT_BIAS
    assert params - {DEFAULT_SPARSE_TABLE, LOGIT_BIAS}, "a network with no dense weights"
    if name != "ctr_dnn":  # wide and FM parts read each key's scalar weight (embed_w)
        assert "slice" in ops


class Seen:
    """Records what it was given; returns the mean of a sequence's first column."""

    inputs: NetworkInputs | None = None

    def __init__(self, params: BaseModel) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Any:
        import paddle

        Seen.inputs = inputs
        seq = next(iter(inputs.sequences.values()))
        return paddle.sum(seq.values[:, :, 0] * seq.mask, axis=1, keepdim=True)


def _with_history(cfg: PipelineConfig, network: str, **hp: Any) -> PipelineConfig:
    """``cfg`` with a sequence slot and a mean-pooled one, training ``network`` with the
    hyper-parameters ``hp`` (the engine's own kept)."""
    data = cfg.model_dump(mode="json", by_alias=True)
    data["schema"]["sparse"] += [
        {"name": "clicked", "multi": True, "pooling": "sequence", "max_length": 5},
        {"name": "tags_mean", "multi": True, "pooling": "mean"},
    ]
    engine = {"sparse_feature_dim", "optimizer", "sparse_table"}
    model = data["model"]
    model["network"] = network
    model["hyper_parameters"] = {
        **{k: v for k, v in model["hyper_parameters"].items() if k in engine},
        **hp,
    }
    return PipelineConfig.model_validate(data)


def test_a_network_gets_pooled_slots_sequences_and_dense(
    shipped_config: PipelineConfig, static_program: Any
) -> None:
    cfg = _with_history(shipped_config, f"{__name__}:Seen")
    graph = _build(cfg)
    seen = Seen.inputs
    assert seen is not None
    assert list(seen.pooled) == [s.name for s in cfg.feature_schema.sparse if s.name != "clicked"]
    assert list(seen.sequences) == ["clicked"]
    dim = cfg.model.hyper_parameters.sparse_feature_dim
    assert list(seen.sequences["clicked"].values.shape) == [-1, 5, dim]
    assert list(seen.sequences["clicked"].mask.shape) == [-1, 5]
    assert list(seen.pooled["tags_mean"].shape) == [-1, dim]
    assert seen.dims == {s.name: dim for s in cfg.feature_schema.sparse}
    assert graph.sequences == {
        "clicked": (seen.sequences["clicked"].values.name, seen.sequences["clicked"].mask.name)
    }
    ops = [op.type for op in static_program.global_block().ops]
    assert "sequence_pad" in ops and "sequence_mask" in ops
    pools = [
        op.attr("pooltype")
        for op in static_program.global_block().ops
        if op.type == "sequence_pool"
    ]
    assert sorted(set(pools)) == ["AVERAGE", "SUM"]


class Wide:
    """Returns one logit per row per unit of ``width``: wrong unless width is 1."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        width: int = 1

    def __init__(self, params: Params) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Any:
        import paddle

        x = paddle.concat(list(inputs.pooled.values()), axis=1)
        return paddle.static.nn.fc(x, self.params.width)


@pytest.mark.parametrize(
    ("network", "hp", "key", "fix"),
    [
        ("no_such_pkg.nets:Net", {}, "model.network", "PYTHONPATH"),
        (f"{__name__}:NoSuchClass", {}, "model.network", "'module:Class'"),
        (f"{__name__}:Wide", {"widht": 2}, "model.hyper_parameters.widht", "spelling"),
        (f"{__name__}:Wide", {"width": "two"}, "model.hyper_parameters.width", "integer"),
        (f"{__name__}:Wide", {"width": 3}, "model.network", "[batch, 1]"),
        (f"{__name__}:Seen", {"fc_sizes": [8]}, "model.hyper_parameters.fc_sizes", "none"),
    ],
)
def test_a_bad_network_fails_naming_the_key(
    shipped_config: PipelineConfig,
    static_program: Any,
    network: str,
    hp: dict[str, Any],
    key: str,
    fix: str,
) -> None:
    cfg = _with_history(shipped_config, network, **hp)
    with pytest.raises(ConfigError) as e:
        _build(cfg)
    assert key in str(e.value) and fix in str(e.value), str(e.value)
    assert e.value.exit_code == 2


def test_model_names_a_network_or_is_a_shipped_one(shipped_config: PipelineConfig) -> None:
    named = derived(shipped_config, "test", model={"model": "mine", "network": "a.b:C"})
    assert network_path(named.model) == "a.b:C"
    shipped = derived(shipped_config, "test", model={"model": "deepfm"})
    assert network_path(shipped.model) == "trainers.networks:DeepFM"
    with pytest.raises(ConfigError, match="not a shipped network's name"):
        derived(shipped_config, "test", model={"model": "mine"})
    with pytest.raises(ConfigError, match=r"model\.network"):
        derived(shipped_config, "test", model={"network": "not an import path"})


CONVERSIONS = Path(__file__).resolve().parents[2] / "examples" / "conversions"


@pytest.mark.parametrize("model", ["model_esmm.yaml", "model_mmoe.yaml"])
def test_a_multi_task_network_gets_a_head_per_label(
    static_program: Any, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(CONVERSIONS))
    cfg = load_config(CONVERSIONS / "pipeline.yaml")
    data = cfg.model_dump(mode="json", by_alias=True)
    data["model"] = yaml.safe_load((CONVERSIONS / model).read_text())
    cfg = PipelineConfig.model_validate(data)
    graph = _build(cfg)
    assert list(graph.tasks) == ["click", "conversion"]
    assert [v.name for v in graph.use_vars][-2:] == ["label", "label_conversion"]
    click, conversion = graph.tasks.values()
    assert (click.label.name, conversion.label.name) == ("label", "label_conversion")
    assert (click.logit_bias, conversion.logit_bias) == (LOGIT_BIAS, f"{LOGIT_BIAS}.conversion")
    assert graph.predict is click.predict  # the main task's, as one-task consumers read it
    assert set(conversion.stat_vars) == set(click.stat_vars)
    assert conversion.stat_vars["count"].name == "stat.conversion.count"
    assert click.stat_vars["count"].name == "stat.count"
    params = {p.name for p in static_program.all_parameters()}
    assert {LOGIT_BIAS, f"{LOGIT_BIAS}.conversion"} <= params
    ops = [op.type for op in static_program.global_block().ops]
    assert ops.count("sigmoid_cross_entropy_with_logits") == 2 and "sum" in ops


class Heads:
    """Returns the heads its ``tasks`` parameter names."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        tasks: list[str] = ["click"]

    def __init__(self, params: Params) -> None:
        self.params = params

    def logits(self, inputs: NetworkInputs) -> Any:
        import paddle

        x = paddle.concat(list(inputs.pooled.values()), axis=1)
        return {task: paddle.static.nn.fc(x, 1) for task in self.params.tasks}


@pytest.mark.parametrize(
    ("tasks", "fix"),
    [(["click", "view"], "among schema.labels"), (["conversion"], "the first ('click')")],
)
def test_heads_that_are_no_labels_fail_naming_the_key(
    shipped_config: PipelineConfig, static_program: Any, tasks: list[str], fix: str
) -> None:
    fs = shipped_config.feature_schema.model_dump(mode="json")
    labels = [{"name": "click"}, {"name": "conversion"}]
    cfg = derived(
        _with_history(shipped_config, f"{__name__}:Heads", tasks=tasks),
        "two labels",
        join={"mode": "label_in_impression"},
        schema={**fs, "labels": labels},
    )
    with pytest.raises(ConfigError, match=r"model\.network") as e:
        _build(cfg)
    assert fix in str(e.value), str(e.value)
