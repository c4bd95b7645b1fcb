"""Each task's loss corrected for labels written before their window closes.

A label written ``at_once`` or ``after_wait`` (``schema.labels[].emit``) trains on rows whose
label is not yet final: observed rows (the label as of the row) and duplicate positives
(a copy of the impression when its label came). Weighting each row's log loss by the ratio
of the true label distribution to the observed one keeps the model's probability that of the
true labels (importance sampling; the weight carries no gradient):

    at_once     (FNW, Ktena et al. 2019)   w+ = 1 + p          w- = (1 - p)(1 + p)
    after_wait  (ES-DFM, Yang et al. 2021) w+ = 1 + p_dp       w- = (1 + p_dp) p_rn

``p`` is the task's own probability; ``p_dp`` (a positive comes after the wait) and ``p_rn``
(an impression negative at the wait stays negative) come from two delay models beside the
network: logistic regressions on the network's inputs (its pooled embeddings, sequences
averaged, and the dense vector, without gradient into them), trained on the matured rows,
whose labels are final. A label written after its window, or carried by the impression, has
weight 1, and so has every row of a label whose ``loss_weights`` is none (the comparison
that shows what the weights are worth). A row trains a task only where its kind says
observed or duplicate; matured rows train the delay models only. The weight formulas are
written once for numpy arrays and Paddle variables alike (the unit test checks them on
numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrec.config import LabelSpec
from streamrec.network import NetworkInputs
from streamrec.passes import RowKind


def fnw_weight(y: Any, p: Any) -> Any:
    """Fake-negative weights: positives ``1 + p``, negatives ``(1 - p)(1 + p)``."""
    return y * (1 + p) + (1 - y) * (1 - p) * (1 + p)


def esdfm_weight(y: Any, p_dp: Any, p_rn: Any) -> Any:
    """ES-DFM weights: positives ``1 + p_dp``, negatives ``(1 + p_dp) p_rn``."""
    return y * (1 + p_dp) + (1 - y) * (1 + p_dp) * p_rn


@dataclass(frozen=True)
class WeightedTask:
    """One task's loss terms and what its metrics read."""

    loss: Any  # the task's corrected loss (its delay models' added)
    trained: Any | None  # 1.0 on the rows that train the task (None: every row)


def _pooled_features(paddle: Any, net: NetworkInputs) -> Any:
    parts = list(net.pooled.values())
    for seq in net.sequences.values():
        mask = paddle.unsqueeze(seq.mask, axis=2)
        total = paddle.sum(seq.values * mask, axis=1)
        parts.append(total / paddle.clip(paddle.sum(mask, axis=1), min=1.0))
    if net.dense is not None:
        parts.append(net.dense)
    features = paddle.concat(parts, axis=1) if len(parts) > 1 else parts[0]
    features.stop_gradient = True  # the delay models learn beside the network, not in it
    return features


def _masked_mean(paddle: Any, values: Any, mask: Any) -> Any:
    return paddle.sum(values * mask) / paddle.clip(paddle.sum(mask), min=1.0)


def _delay_model(paddle: Any, features: Any, name: str) -> Any:
    return paddle.static.nn.fc(
        features,
        size=1,
        weight_attr=paddle.ParamAttr(name=f"{name}.w_0"),
        bias_attr=paddle.ParamAttr(name=f"{name}.b_0"),
    )


def weighted_task(
    paddle: Any,
    spec: LabelSpec,
    logit: Any,
    label: Any,
    kind: Any | None,
    delay: Any | None,
    net: NetworkInputs,
) -> WeightedTask:
    """The loss of the task of label ``spec`` from its ``logit`` (bias included): plain
    log loss without row kinds (``kind`` None), else weighted by its emit policy over the
    rows that train it, with an after_wait label's delay models and their losses."""
    y = paddle.cast(label, "float32")
    log_loss = paddle.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="none")
    if kind is None:
        return WeightedTask(paddle.mean(log_loss), None)
    trained = paddle.cast(
        paddle.logical_and(kind > RowKind.ABSENT + 0.5, kind < RowKind.DUPLICATE + 0.5), "float32"
    )
    extra = []
    if spec.loss_weights == "none":
        weight = paddle.ones_like(y)
    elif spec.emit == "at_once":
        weight = fnw_weight(y, paddle.nn.functional.sigmoid(logit))
    elif spec.emit == "after_wait":
        assert delay is not None  # the schema's row columns carry it
        features = _pooled_features(paddle, net)
        dp_logit = _delay_model(paddle, features, f"delay_{spec.name}_dp")
        rn_logit = _delay_model(paddle, features, f"delay_{spec.name}_rn")
        matured = paddle.cast(kind > RowKind.MATURED - 0.5, "float32")
        wait_ms = float((spec.wait_seconds or 0) * 1000)
        by_wait = paddle.cast(paddle.logical_and(delay > -0.5, delay < wait_ms + 0.5), "float32")
        bce = paddle.nn.functional.binary_cross_entropy_with_logits
        dp_loss = bce(dp_logit, y * (1 - by_wait), reduction="none")
        rn_loss = bce(rn_logit, 1 - y, reduction="none")
        extra = [
            _masked_mean(paddle, dp_loss, matured),
            _masked_mean(paddle, rn_loss, matured * (1 - by_wait)),
        ]
        sigmoid = paddle.nn.functional.sigmoid
        weight = esdfm_weight(y, sigmoid(dp_logit), sigmoid(rn_logit))
    else:
        weight = paddle.ones_like(y)
    weight.stop_gradient = True  # importance weights: no gradient through them
    loss = _masked_mean(paddle, log_loss * weight, trained)
    return WeightedTask(paddle.add_n([loss, *extra]) if extra else loss, trained)
