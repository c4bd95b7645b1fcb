"""Static-graph CTR models for the parameter-server cluster, chosen by name from config.

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


class CtrDnn:
    """PaddleRec's CTR DNN: pooled slot embeddings + dense features -> MLP -> sigmoid."""

    def build(self, schema: SchemaConfig, hp: HyperParameters) -> ModelGraph:
        import paddle

        init = paddle.nn.initializer.Uniform(-0.01, 0.01)
        slots = [
            paddle.static.data(name=s.name, shape=[-1, 1], dtype="int64", lod_level=1)
            for s in schema.sparse
        ]
        pooled: dict[str, str] = {}
        features = []
        for slot, var in zip(schema.sparse, slots, strict=True):
            emb = paddle.static.nn.sparse_embedding(
                input=var,
                size=[1 << 20, hp.sparse_feature_dim],
                param_attr=paddle.ParamAttr(name=SPARSE_TABLE, initializer=init),
            )
            pool = paddle.static.nn.sequence_lod.sequence_pool(emb, "sum")
            pooled[slot.name] = pool.name
            features.append(pool)
        use_vars = list(slots)
        dense = None
        if schema.dense:
            dense = paddle.static.data(
                name=DENSE_VAR, shape=[-1, len(schema.dense)], dtype="float32"
            )
            features.append(dense)
            use_vars.append(dense)
        label = paddle.static.data(name=LABEL_VAR, shape=[-1, 1], dtype="int64")
        use_vars.append(label)

        x = paddle.concat(features, axis=1)
        for i, width in enumerate(hp.fc_sizes):
            x = paddle.static.nn.fc(
                x,
                width,
                activation="relu",
                weight_attr=paddle.ParamAttr(name=f"dnn.fc{i}.w"),
                bias_attr=paddle.ParamAttr(name=f"dnn.fc{i}.b"),
            )
        logit = paddle.static.nn.fc(
            x,
            1,
            weight_attr=paddle.ParamAttr(name="dnn.out.w"),
            bias_attr=paddle.ParamAttr(name="dnn.out.b"),
        )
        predict = paddle.nn.functional.sigmoid(logit)
        loss = paddle.mean(
            paddle.nn.functional.binary_cross_entropy_with_logits(
                logit, paddle.cast(label, "float32")
            )
        )
        return ModelGraph(
            use_vars=use_vars,
            predict=predict,
            loss=loss,
            pooled=pooled,
            dense_var=dense.name if dense is not None else None,
            stat_vars=metric_stats(paddle, predict, label),
        )


MODELS: dict[str, type[CtrModel]] = {"ctr_dnn": CtrDnn}
