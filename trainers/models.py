"""The static-graph program the cluster trains: the pipeline's part around the network.

Before the network (``streamrec.network``, named by ``model.network``): one
``sparse_embedding`` lookup per slot into its sparse table (``streamrec.config.tables``: the
shared one unless ``sparse_tables`` names the slot), pooled as the schema says (sum, mean,
or a padded sequence with its mask), and the dense vector. After
it: the bias ``LOGIT_BIAS`` (the intercept refit moves it), the sigmoid, the loss and the
metric accumulators. The pooled embeddings and the sequences are named feeds of the
inference program, so the exported dense program takes embeddings as input and serving
looks keys up itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streaming.pipe_reader import DENSE_VAR, LABEL_VAR
from streamrec.config import (
    ModelConfig,
    SchemaConfig,
    SparseTableSpec,
    sparse_tables,
)
from streamrec.errors import ConfigError
from streamrec.network import LOGIT_BIAS, NetworkInputs, SequenceInput
from trainers.network_loader import load_network

AUC_BUCKETS = 4095


@dataclass(frozen=True)
class ModelGraph:
    """Variables of a built model that the cluster loop needs."""

    use_vars: list[Any]  # reader order: sparse slots, dense, label
    predict: Any  # click probability, shape [-1, 1]
    loss: Any
    pooled: dict[str, str]  # pooled slot -> its embedding var's name (inference feed)
    sequences: dict[str, tuple[str, str]]  # sequence slot -> (values, mask) var names (feeds)
    logit_bias: str  # the dense parameter that adds straight to the logit (``intercept``)
    dense_var: str | None
    stat_vars: dict[str, Any]  # metric accumulators, summed across workers


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
    """The network's inputs and what the program reads them from."""

    use_vars: list[Any]
    network: NetworkInputs
    label: Any


def _inputs(paddle: Any, schema: SchemaConfig, tables: dict[str, SparseTableSpec]) -> _Inputs:
    init = paddle.nn.initializer.Uniform(-0.01, 0.01)
    table_of = {slot: t for t in tables.values() for slot in t.slots}
    use_vars: list[Any] = []
    pooled: dict[str, Any] = {}
    sequences: dict[str, SequenceInput] = {}
    for slot in schema.sparse:
        var = paddle.static.data(name=slot.name, shape=[-1, 1], dtype="int64", lod_level=1)
        use_vars.append(var)
        table = table_of[slot.name]
        emb = paddle.static.nn.sparse_embedding(
            input=var,
            size=[1 << 20, table.dim],
            param_attr=paddle.ParamAttr(name=table.name, initializer=init),
        )
        if slot.pooling == "sequence":
            pad = paddle.full(shape=[1], fill_value=0.0, dtype="float32")
            values, length = paddle.static.nn.sequence_lod.sequence_pad(
                emb, pad, maxlen=slot.max_length
            )
            mask = paddle.nn.functional.sequence_mask(
                paddle.reshape(length, [-1]), maxlen=slot.max_length, dtype="float32"
            )
            sequences[slot.name] = SequenceInput(values, mask)
        else:
            kind = "average" if slot.pooling == "mean" else "sum"
            pooled[slot.name] = paddle.static.nn.sequence_lod.sequence_pool(emb, kind)
    dense = None
    if schema.dense:
        dense = paddle.static.data(name=DENSE_VAR, shape=[-1, len(schema.dense)], dtype="float32")
        use_vars.append(dense)
    label = paddle.static.data(name=LABEL_VAR, shape=[-1, 1], dtype="int64")
    use_vars.append(label)
    dims = {s.name: table_of[s.name].dim for s in schema.sparse}
    return _Inputs(use_vars, NetworkInputs(pooled, sequences, dense, dims), label)


def _network_logit(paddle: Any, model: ModelConfig, inputs: NetworkInputs) -> Any:
    """The network's logit, checked: a failure while building, or a shape other than
    [batch, 1], is a ConfigError naming model.network."""
    network = load_network(model)
    try:
        logit = network.logit(inputs)
    except Exception as e:  # the user's graph code: report it as the config's fault
        raise ConfigError(
            f"model.network: building {model.network_path} failed: {type(e).__name__}: {e}"
        ) from e
    shape = list(getattr(logit, "shape", []) or [])
    if not isinstance(logit, paddle.static.Variable) or len(shape) != 2 or shape[1] != 1:
        raise ConfigError(
            f"model.network: {model.network_path}.logit returned "
            f"{'shape ' + str(shape) if shape else type(logit).__name__}; it must return one "
            "logit per row, a tensor of shape [batch, 1]"
        )
    return logit


def build_model(schema: SchemaConfig, model: ModelConfig) -> ModelGraph:
    """The training program's graph in the current static program: inputs, the network
    ``model.network`` names, its bias, the loss and the metric accumulators."""
    import paddle

    inputs = _inputs(paddle, schema, sparse_tables(schema, model))
    bias = paddle.static.create_parameter(
        shape=[1],
        dtype="float32",
        name=LOGIT_BIAS,
        default_initializer=paddle.nn.initializer.Constant(0.0),
    )
    logit = _network_logit(paddle, model, inputs.network) + bias
    predict = paddle.nn.functional.sigmoid(logit)
    loss = paddle.mean(
        paddle.nn.functional.binary_cross_entropy_with_logits(
            logit, paddle.cast(inputs.label, "float32")
        )
    )
    net = inputs.network
    return ModelGraph(
        use_vars=inputs.use_vars,
        predict=predict,
        loss=loss,
        pooled={name: v.name for name, v in net.pooled.items()},
        sequences={name: (q.values.name, q.mask.name) for name, q in net.sequences.items()},
        logit_bias=LOGIT_BIAS,
        dense_var=net.dense.name if net.dense is not None else None,
        stat_vars=metric_stats(paddle, predict, inputs.label),
    )
