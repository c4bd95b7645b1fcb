"""Static-graph CTR models for the parameter-server cluster, chosen by name from config:
``ctr_dnn``, ``wide_deep`` and ``deepfm``.

Every model reads the same inputs (one ``sparse_embedding`` lookup per slot into the shared
table ``SPARSE_TABLE``, sum-pooled; one ``dense`` vector; ``label``) and returns a
``ModelGraph``. The pooled embeddings are named feeds of the inference program, so the
exported dense program takes embeddings as input and serving looks keys up itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from streaming.pipe_reader import DENSE_VAR, LABEL_VAR
from streamrec.config import HyperParameters, SchemaConfig

SPARSE_TABLE = "SparseFeatFactors"
AUC_BUCKETS = 4095


@dataclass(frozen=True)
class ModelGraph:
    """Variables of a built model that the cluster loop needs."""

    use_vars: list[Any]  # reader order: sparse slots, dense, label
    predict: Any  # click probability, shape [-1, 1]
    loss: Any
    pooled: dict[str, str]  # slot name -> pooled embedding var name (inference feed)
    logit_bias: str  # the dense parameter that adds straight to the logit (``intercept``)
    dense_var: str | None
    stat_vars: dict[str, Any]  # metric accumulators, summed across workers


class CtrModel(Protocol):
    def build(self, schema: SchemaConfig, hp: HyperParameters) -> ModelGraph: ...


def _accumulate(paddle: Any, name: str, batch_value: Any) -> Any:
    acc = paddle.static.create_global_var(
        shape=[1], value=0.0, dtype="float64", persistable=True, name=f"stat.{name}"
    )
    paddle.assign(paddle.add(acc, paddle.cast(paddle.sum(batch_value), "float64")), acc)
    return acc


def metric_stats(paddle: Any, predict: Any, label: Any) -> dict[str, Any]:
    """Persistable accumulators of AUC buckets and sums (count, clicks, predictions, errors)."""
    y = paddle.cast(label, "float32")
    p = paddle.clip(predict, 1e-7, 1 - 1e-7)
    _, _, [_, _, stat_pos, stat_neg] = paddle.static.auc(
        input=paddle.concat([1 - predict, predict], axis=1),
        label=label,
        num_thresholds=AUC_BUCKETS,
        slide_steps=0,
    )
    logloss = -(y * paddle.log(p) + (1 - y) * paddle.log(1 - p))
    return {
        "auc_pos": stat_pos,
        "auc_neg": stat_neg,
        "count": _accumulate(paddle, "count", paddle.ones_like(y)),
        "clicks": _accumulate(paddle, "clicks", y),
        "pred_sum": _accumulate(paddle, "pred_sum", predict),
        "logloss_sum": _accumulate(paddle, "logloss_sum", logloss),
        "abs_err_sum": _accumulate(paddle, "abs_err_sum", paddle.abs(y - predict)),
        "sq_err_sum": _accumulate(paddle, "sq_err_sum", paddle.square(y - predict)),
    }


@dataclass(frozen=True)
class _Inputs:
    """What every model reads: per-slot pooled embeddings, the dense vector, the label."""

    use_vars: list[Any]
    pooled: list[Any]  # [batch, sparse_feature_dim] per slot: embed_w, then embedx
    dense: Any | None
    label: Any


def _inputs(paddle: Any, schema: SchemaConfig, hp: HyperParameters) -> _Inputs:
    init = paddle.nn.initializer.Uniform(-0.01, 0.01)
    slots = [
        paddle.static.data(name=s.name, shape=[-1, 1], dtype="int64", lod_level=1)
        for s in schema.sparse
    ]
    pooled = []
    for var in slots:
        emb = paddle.static.nn.sparse_embedding(
            input=var,
            size=[1 << 20, hp.sparse_feature_dim],
            param_attr=paddle.ParamAttr(name=SPARSE_TABLE, initializer=init),
        )
        pooled.append(paddle.static.nn.sequence_lod.sequence_pool(emb, "sum"))
    use_vars = list(slots)
    dense = None
    if schema.dense:
        dense = paddle.static.data(name=DENSE_VAR, shape=[-1, len(schema.dense)], dtype="float32")
        use_vars.append(dense)
    label = paddle.static.data(name=LABEL_VAR, shape=[-1, 1], dtype="int64")
    use_vars.append(label)
    return _Inputs(use_vars, pooled, dense, label)


def _out_bias(prefix: str) -> str:
    """The bias of an MLP's logit layer: it adds straight to the model's logit."""
    return f"{prefix}.out.b"


def _mlp(paddle: Any, x: Any, sizes: list[int], prefix: str) -> Any:
    """ReLU layers of ``sizes``, then one logit."""
    for i, width in enumerate(sizes):
        x = paddle.static.nn.fc(
            x,
            width,
            activation="relu",
            weight_attr=paddle.ParamAttr(name=f"{prefix}.fc{i}.w"),
            bias_attr=paddle.ParamAttr(name=f"{prefix}.fc{i}.b"),
        )
    return paddle.static.nn.fc(
        x,
        1,
        weight_attr=paddle.ParamAttr(name=f"{prefix}.out.w"),
        bias_attr=paddle.ParamAttr(name=_out_bias(prefix)),
    )


def _graph(
    paddle: Any, inputs: _Inputs, schema: SchemaConfig, logit: Any, logit_bias: str
) -> ModelGraph:
    predict = paddle.nn.functional.sigmoid(logit)
    loss = paddle.mean(
        paddle.nn.functional.binary_cross_entropy_with_logits(
            logit, paddle.cast(inputs.label, "float32")
        )
    )
    return ModelGraph(
        use_vars=inputs.use_vars,
        predict=predict,
        loss=loss,
        pooled={s.name: v.name for s, v in zip(schema.sparse, inputs.pooled, strict=True)},
        logit_bias=logit_bias,
        dense_var=inputs.dense.name if inputs.dense is not None else None,
        stat_vars=metric_stats(paddle, predict, inputs.label),
    )


def _first_order(paddle: Any, inputs: _Inputs) -> Any:
    """Sum over slots of each key's scalar weight (``embed_w``), plus a linear dense term:
    the logistic-regression part of Wide&Deep and DeepFM."""
    weights = paddle.concat([v[:, :1] for v in inputs.pooled], axis=1)
    logit = paddle.sum(weights, axis=1, keepdim=True)
    if inputs.dense is not None:
        logit = logit + paddle.static.nn.fc(
            inputs.dense,
            1,
            weight_attr=paddle.ParamAttr(name="wide.dense.w"),
            bias_attr=paddle.ParamAttr(name="wide.dense.b"),
        )
    return logit


def _factors(inputs: _Inputs) -> list[Any]:
    return [v[:, 1:] for v in inputs.pooled]  # embedx: the latent vector of each slot


def _with_dense(inputs: _Inputs, features: list[Any]) -> list[Any]:
    return features + ([inputs.dense] if inputs.dense is not None else [])


class CtrDnn:
    """PaddleRec's CTR DNN: pooled slot embeddings + dense features -> MLP -> sigmoid."""

    def build(self, schema: SchemaConfig, hp: HyperParameters) -> ModelGraph:
        import paddle

        inputs = _inputs(paddle, schema, hp)
        features = _with_dense(inputs, inputs.pooled)
        logit = _mlp(paddle, paddle.concat(features, axis=1), hp.fc_sizes, "dnn")
        return _graph(paddle, inputs, schema, logit, _out_bias("dnn"))


class WideDeep:
    """Wide&Deep (PaddleRec models/rank/wide_deep): a wide linear part over each key's
    scalar weight and the dense features, plus a deep MLP over the slots' latent vectors
    and the dense features; one shared sparse table holds both parts of every key."""

    def build(self, schema: SchemaConfig, hp: HyperParameters) -> ModelGraph:
        import paddle

        inputs = _inputs(paddle, schema, hp)
        deep_in = _with_dense(inputs, _factors(inputs))
        deep = _mlp(paddle, paddle.concat(deep_in, axis=1), hp.fc_sizes, "deep")
        logit = _first_order(paddle, inputs) + deep
        return _graph(paddle, inputs, schema, logit, _out_bias("deep"))


class DeepFM:
    """DeepFM (PaddleRec models/rank/deepfm): first-order weights, second-order factorization
    machine interactions between the slots' latent vectors, and a deep MLP over them."""

    def build(self, schema: SchemaConfig, hp: HyperParameters) -> ModelGraph:
        import paddle

        inputs = _inputs(paddle, schema, hp)
        factors = _factors(inputs)
        stacked = paddle.stack(factors, axis=1)  # [batch, slots, embedx_dim]
        summed_square = paddle.square(paddle.sum(stacked, axis=1))
        square_summed = paddle.sum(paddle.square(stacked), axis=1)
        fm = 0.5 * paddle.sum(summed_square - square_summed, axis=1, keepdim=True)
        deep_in = _with_dense(inputs, factors)
        deep = _mlp(paddle, paddle.concat(deep_in, axis=1), hp.fc_sizes, "deep")
        logit = _first_order(paddle, inputs) + fm + deep
        return _graph(paddle, inputs, schema, logit, _out_bias("deep"))


MODELS: dict[str, type[CtrModel]] = {"ctr_dnn": CtrDnn, "wide_deep": WideDeep, "deepfm": DeepFM}
