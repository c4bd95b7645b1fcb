"""The public model API: what a network receives from the pipeline and what it returns.

A model YAML names its network by import path, ``network: mypkg.nets:MyNet``; the built-ins
(``ctr_dnn``, ``wide_deep``, ``deepfm``) are ordinary users of it. It is the one import a
network needs: the inputs, the needs, and the building blocks the built-ins use
(``slot_vectors``, ``mlp``, ``with_dense``).
``MyNet`` is a class (any callable) with

- ``Params``: a pydantic model of its hyper-parameters. Every key of the YAML's
  ``hyper_parameters`` block that the engine does not own (``sparse_feature_dim``,
  ``optimizer``, ``sparse_table``, ``sparse_tables``) is validated by it; a key it does not
  declare is an error.
  A network without hyper-parameters leaves ``Params`` out.
- ``MyNet(params)`` returns a ``Network``: an object whose ``logit(inputs)`` builds the
  network's part of a Paddle static graph and returns the logit, shape ``[batch, 1]``; it
  trains the schema's first label. A network with a head per label (CTR and CVR, ESMM- or
  MMoE-style) is a ``MultiTaskNetwork`` instead: ``logits(inputs)`` returns one such logit
  per task, by label name (``schema.labels``), the first label's among them.

A network may declare what it reads of the feature schema: ``needs(params)`` (a static or
class method) returns a ``NetworkNeeds``, checked against the schema by every command that
uses the model (``streamrec cluster``, ``streamrec schema``, the demo) before any work, so
that a slot it reads as a sequence that is not one fails with exit 2 naming the slot and
the fix, not with a ``KeyError`` in the cluster's first build.

The pipeline builds everything around it: the sparse lookups and their pooling before it;
after it, per task, a scalar bias (``logit_bias``, the one the intercept refit moves), the
sigmoid, the loss (the tasks' log losses summed), the progressive metrics. The same
network is built on every worker and in the exported inference program, so it must only
use Paddle's static-graph API (``paddle.*``, ``paddle.static.nn.fc`` with named
``ParamAttr``); its dense parameters live on the servers like any other. This module
imports no stage, and paddle only inside the building blocks, when a graph is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

Tensor = Any  # a Paddle static-graph Variable; typed loosely so this module stays paddle-free

LOGIT_BIAS = "streamrec.logit_bias"  # added to the main task's logit; the refit shifts it
# names a model YAML may give instead of an import path (the cluster maps them to the
# shipped networks' classes)
SHIPPED = ("ctr_dnn", "wide_deep", "deepfm")
IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


@dataclass(frozen=True)
class SequenceInput:
    """A ``pooling: sequence`` slot: each row's keys in order (oldest first), padded or cut
    to the slot's ``max_length``."""

    values: Tensor  # [batch, max_length, dim] float32; zeros where the mask is 0
    mask: Tensor  # [batch, max_length] float32: 1 for a key, 0 for padding


@dataclass(frozen=True)
class NetworkInputs:
    """Everything a network reads, by the feature schema's slot names."""

    pooled: Mapping[str, Tensor]  # every slot but the sequences: [batch, dim], sum or mean
    sequences: Mapping[str, SequenceInput]  # the ``pooling: sequence`` slots
    dense: Tensor | None  # [batch, len(schema.dense)] float32; None without dense features
    dims: Mapping[str, int]  # each slot's embedding width: column 0 is the key's scalar
    # weight (embed_w), the rest its latent vector (embedx)


@dataclass(frozen=True)
class NetworkNeeds:
    """What a network reads of the feature schema, by name."""

    sequences: tuple[str, ...] = ()  # slots read from ``inputs.sequences``: pooling sequence
    pooled: tuple[str, ...] = ()  # slots read from ``inputs.pooled``: any other pooling
    labels: tuple[str, ...] = ()  # labels it heads (a MultiTaskNetwork's tasks) or reads
    dense: bool = False  # reads ``inputs.dense``: the schema has dense features


@runtime_checkable
class Network(Protocol):
    """A built network: ``logit`` adds its ops to the current static program."""

    def logit(self, inputs: NetworkInputs) -> Tensor:
        """The logit of each row, shape ``[batch, 1]``, before the pipeline's bias."""
        ...


@runtime_checkable
class MultiTaskNetwork(Protocol):
    """A built network with a head per task: ``logits`` adds its ops to the current static
    program."""

    def logits(self, inputs: NetworkInputs) -> Mapping[str, Tensor]:
        """Each task's logit by label name, shape ``[batch, 1]``, before the pipeline's
        bias; the schema's first label (the main task) among them."""
        ...


def logit_bias(task: str, main: str) -> str:
    """The name of the bias added to ``task``'s logit (``main``: the main task's name)."""
    return LOGIT_BIAS if task == main else f"{LOGIT_BIAS}.{task}"


class NoParams(BaseModel):
    """The hyper-parameters of a network that declares none."""

    model_config = {"extra": "forbid", "frozen": True}


class NetworkFactory(Protocol):
    """What ``network: module:Name`` names: ``Name(params)`` makes the ``Network``."""

    Params: ClassVar[type[BaseModel]]

    def __call__(self, params: Any) -> Network | MultiTaskNetwork: ...


def slot_vectors(inputs: NetworkInputs) -> list[Tensor]:
    """One ``[batch, dim]`` vector per slot: the pooled slots as they come, then each
    sequence mean-pooled over its mask (for networks that do not attend)."""
    import paddle

    vectors = list(inputs.pooled.values())
    for seq in inputs.sequences.values():
        summed = paddle.sum(seq.values * paddle.unsqueeze(seq.mask, -1), axis=1)
        count = paddle.clip(paddle.sum(seq.mask, axis=1, keepdim=True), min=1.0)
        vectors.append(summed / count)
    return vectors


def mlp(x: Tensor, sizes: list[int], prefix: str) -> Tensor:
    """ReLU layers of ``sizes``, then one logit; parameters named ``prefix.fc<i>.w`` etc."""
    import paddle

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
        bias_attr=paddle.ParamAttr(name=f"{prefix}.out.b"),
    )


def with_dense(features: list[Tensor], dense: Tensor | None) -> list[Tensor]:
    """``features`` and the dense vector after them, when the schema has one."""
    return features + ([dense] if dense is not None else [])
