"""The shipped networks, each an ordinary user of the model API (``streamrec.network``):
``ctr_dnn``, ``wide_deep`` and ``deepfm`` in a model YAML name these classes.

They read the pooled slots (a sequence slot enters them mean-pooled over its mask) and the
dense features; their dense parameters are named by ``prefix.layer`` so a checkpoint's
dense tables stay readable.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from streamrec.network import NetworkInputs, Tensor, mlp, slot_vectors, with_dense


class MlpParams(BaseModel):
    """Hyper-parameters of the shipped networks' MLP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fc_sizes: list[int] = Field([64, 32], min_length=1, description="Hidden layer widths.")


def _first_order(vectors: list[Tensor], dense: Tensor | None) -> Tensor:
    """Sum over slots of each key's scalar weight (``embed_w``), plus a linear dense term:
    the logistic-regression part of Wide&Deep and DeepFM."""
    import paddle

    logit = paddle.sum(paddle.concat([v[:, :1] for v in vectors], axis=1), axis=1, keepdim=True)
    if dense is not None:
        logit = logit + paddle.static.nn.fc(
            dense,
            1,
            weight_attr=paddle.ParamAttr(name="wide.dense.w"),
            bias_attr=paddle.ParamAttr(name="wide.dense.b"),
        )
    return logit


class CtrDnn:
    """PaddleRec's CTR DNN: pooled slot embeddings + dense features -> MLP."""

    Params = MlpParams

    def __init__(self, params: MlpParams) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Tensor:
        import paddle

        features = with_dense(slot_vectors(inputs), inputs.dense)
        return mlp(paddle.concat(features, axis=1), self.params.fc_sizes, "dnn")


class WideDeep:
    """Wide&Deep (PaddleRec models/rank/wide_deep): a wide linear part over each key's
    scalar weight and the dense features, plus a deep MLP over the slots' latent vectors
    and the dense features; one embedding holds both parts of every key."""

    Params = MlpParams

    def __init__(self, params: MlpParams) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Tensor:
        import paddle

        vectors = slot_vectors(inputs)
        deep_in = with_dense([v[:, 1:] for v in vectors], inputs.dense)
        deep = mlp(paddle.concat(deep_in, axis=1), self.params.fc_sizes, "deep")
        return _first_order(vectors, inputs.dense) + deep


class DeepFM:
    """DeepFM (PaddleRec models/rank/deepfm): first-order weights, second-order factorization
    machine interactions between the slots' latent vectors, and a deep MLP over them. The
    interactions need every slot's latent vector of one width."""

    Params = MlpParams

    def __init__(self, params: MlpParams) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Tensor:
        import paddle

        vectors = slot_vectors(inputs)
        factors = [v[:, 1:] for v in vectors]
        widths = set(inputs.dims.values())
        if len(widths) > 1:
            raise ValueError(
                f"deepfm crosses every slot with every other: their embeddings must have "
                f"one width, these have {sorted(widths)}"
            )
        stacked = paddle.stack(factors, axis=1)  # [batch, slots, embedx_dim]
        summed_square = paddle.square(paddle.sum(stacked, axis=1))
        square_summed = paddle.sum(paddle.square(stacked), axis=1)
        fm = 0.5 * paddle.sum(summed_square - square_summed, axis=1, keepdim=True)
        deep_in = with_dense(factors, inputs.dense)
        deep = mlp(paddle.concat(deep_in, axis=1), self.params.fc_sizes, "deep")
        return _first_order(vectors, inputs.dense) + fm + deep
