"""The static-graph program the cluster trains: the pipeline's part around the network.

Before the network (``streamrec.network``, named by ``model.network``): one
``sparse_embedding`` lookup per slot into its sparse table (``streamrec.config.tables``: the
shared one unless ``sparse_tables`` names the slot), pooled as the schema says (sum, mean,
or a padded sequence with its mask), and the dense vector. After
it, for each task (the schema's first label, or one per label a multi-task network heads):
its bias (the intercept refit moves it), the sigmoid, its loss (summed over the tasks) and
its metric accumulators. The pooled embeddings and the sequences are named feeds of the
inference program, so the exported dense program takes embeddings as input and serving
looks keys up itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streaming.pipe_reader import DENSE_VAR, ROW_VAR
from streamrec.config import (
    ModelConfig,
    SchemaConfig,
    SparseTableSpec,
    delay_column,
    kind_column,
    sparse_tables,
)
from streamrec.errors import ConfigError
from streamrec.network import MultiTaskNetwork, NetworkInputs, SequenceInput, logit_bias
from trainers.delay_weights import weighted_task
from trainers.network_loader import load_network, network_path

AUC_BUCKETS = 4095


@dataclass(frozen=True)
class TaskGraph:
    """One task's head: what it predicts, from which label, and its accumulators."""

    predict: Any  # the label's probability, shape [-1, 1]
    label: Any  # its label's data var
    logit_bias: str  # the dense parameter that adds straight to its logit (``intercept``)
    stat_vars: dict[str, Any]  # metric accumulators, summed across workers
    kind: Any | None = None  # its rows' kind var (a fresh label): metrics count trained rows


@dataclass(frozen=True)
class ModelGraph:
    """Variables of a built model that the cluster loop needs."""

    use_vars: list[Any]  # reader order: sparse slots, dense, labels
    loss: Any
    pooled: dict[str, str]  # pooled slot -> its embedding var's name (inference feed)
    sequences: dict[str, tuple[str, str]]  # sequence slot -> (values, mask) var names (feeds)
    dense_var: str | None
    tasks: dict[str, TaskGraph]  # label name -> its head, the main task (first label) first
    # "<task>|<given>" -> (task, given): a task whose label requires another's (a conversion
    # its click) is also measured on the rows where that label is 1, its probability
    # divided by the given head's (p(conversion | click) on the clicked rows)
    conditionals: dict[str, tuple[str, str]]
    row_index: str | None = None  # fresh labels: the var naming each row (``ROW_VAR``)

    @property
    def main(self) -> TaskGraph:
        """The main task's head: the schema's first label."""
        return next(iter(self.tasks.values()))

    @property
    def predict(self) -> Any:
        """The main task's probability."""
        return self.main.predict


def _accumulate(paddle: Any, name: str, batch_value: Any) -> Any:
    acc = paddle.static.create_global_var(
        shape=[1], value=0.0, dtype="float64", persistable=True, name=f"stat{name}"
    )
    paddle.assign(paddle.add(acc, paddle.cast(paddle.sum(batch_value), "float64")), acc)
    return acc


def metric_stats(paddle: Any, predict: Any, label: Any, task: str = "") -> dict[str, Any]:
    """Persistable accumulators of AUC buckets and sums (count, clicks, predictions,
    errors); ``task`` names a further task's (the main task's keep their names)."""
    prefix = f".{task}" if task else ""
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
        "count": _accumulate(paddle, f"{prefix}.count", paddle.ones_like(y)),
        "clicks": _accumulate(paddle, f"{prefix}.clicks", y),
        "pred_sum": _accumulate(paddle, f"{prefix}.pred_sum", predict),
        "logloss_sum": _accumulate(paddle, f"{prefix}.logloss_sum", logloss),
        "abs_err_sum": _accumulate(paddle, f"{prefix}.abs_err_sum", paddle.abs(y - predict)),
        "sq_err_sum": _accumulate(paddle, f"{prefix}.sq_err_sum", paddle.square(y - predict)),
    }


@dataclass(frozen=True)
class _Inputs:
    """The network's inputs and what the program reads them from."""

    use_vars: list[Any]
    network: NetworkInputs
    labels: dict[str, Any]  # label name -> its data var
    kinds: dict[str, Any]  # label name -> its rows' kind (a fresh label in the schema)
    delays: dict[str, Any]  # after_wait label name -> its delay as of the row


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
    labels = {}
    for label, column in zip(schema.labels, schema.label_columns, strict=True):
        labels[label.name] = paddle.static.data(name=column, shape=[-1, 1], dtype="int64")
        use_vars.append(labels[label.name])
    rows = {}
    for column in schema.row_columns:
        rows[column] = paddle.static.data(name=column, shape=[-1, 1], dtype="float32")
        use_vars.append(rows[column])
    names = [label.name for label in schema.labels]
    kinds = {n: rows[kind_column(n)] for n in names if kind_column(n) in rows}
    delays = {n: rows[delay_column(n)] for n in names if delay_column(n) in rows}
    if schema.fresh_labels:  # which row each score is of, for the matured metrics
        use_vars.append(paddle.static.data(name=ROW_VAR, shape=[-1, 1], dtype="int64"))
    dims = {s.name: table_of[s.name].dim for s in schema.sparse}
    network = NetworkInputs(pooled, sequences, dense, dims)
    return _Inputs(use_vars, network, labels, kinds, delays)


def _network_logits(
    paddle: Any, model: ModelConfig, inputs: NetworkInputs, labels: list[str]
) -> dict[str, Any]:
    """Each task's logit, by label name, checked: a failure while building, a task that is
    no label or lacks the main one, or a shape other than [batch, 1] is a ConfigError
    naming model.network."""
    network = load_network(model)
    path = network_path(model)
    try:
        if isinstance(network, MultiTaskNetwork):
            logits = network.logits(inputs)
        else:
            logits = {labels[0]: network.logit(inputs)}
    except Exception as e:  # the user's graph code: report it as the config's fault
        raise ConfigError(f"model.network: building {path} failed: {type(e).__name__}: {e}") from e
    if not isinstance(logits, Mapping) or labels[0] not in logits or set(logits) - set(labels):
        got = sorted(logits) if isinstance(logits, Mapping) else type(logits).__name__
        raise ConfigError(
            f"model.network: {path}.logits returned {got}; it must return a logit per task "
            f"by label name, among schema.labels {labels}, the first ({labels[0]!r}) included"
        )
    for task, logit in logits.items():
        shape = list(getattr(logit, "shape", []) or [])
        if not isinstance(logit, paddle.static.Variable) or len(shape) != 2 or shape[1] != 1:
            what = "shape " + str(shape) if shape else type(logit).__name__
            raise ConfigError(
                f"model.network: {path} returned {what} for task {task!r}; it must return "
                "one logit per row, a tensor of shape [batch, 1]"
            )
    return {label: logits[label] for label in labels if label in logits}


def build_model(schema: SchemaConfig, model: ModelConfig) -> ModelGraph:
    """The training program's graph in the current static program: inputs, the network
    ``model.network`` names, and per task its bias, loss and metric accumulators."""
    import paddle

    inputs = _inputs(paddle, schema, sparse_tables(schema, model))
    names = [label.name for label in schema.labels]
    specs = {label.name: label for label in schema.labels}
    logits = _network_logits(paddle, model, inputs.network, names)
    tasks, losses = {}, []
    for task, logit in logits.items():
        bias = paddle.static.create_parameter(
            shape=[1],
            dtype="float32",
            name=logit_bias(task, names[0]),
            default_initializer=paddle.nn.initializer.Constant(0.0),
        )
        label = inputs.labels[task]
        predict = paddle.nn.functional.sigmoid(logit + bias)
        weighted = weighted_task(
            paddle,
            specs[task],
            logit + bias,
            label,
            inputs.kinds.get(task),
            inputs.delays.get(task),
            inputs.network,
        )
        losses.append(weighted.loss)
        stats = metric_stats(paddle, predict, label, "" if task == names[0] else task)
        tasks[task] = TaskGraph(predict, label, bias.name, stats, inputs.kinds.get(task))
    net = inputs.network
    return ModelGraph(
        use_vars=inputs.use_vars,
        loss=losses[0] if len(losses) == 1 else paddle.add_n(losses),
        pooled={name: v.name for name, v in net.pooled.items()},
        sequences={name: (q.values.name, q.mask.name) for name, q in net.sequences.items()},
        dense_var=net.dense.name if net.dense is not None else None,
        tasks=tasks,
        conditionals={
            f"{label.name}|{label.requires}": (label.name, label.requires)
            for label in schema.labels
            if label.requires in tasks and label.name in tasks
        },
        row_index=ROW_VAR if schema.fresh_labels else None,
    )
