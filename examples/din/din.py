"""A DIN-style network (Deep Interest Network, Zhou et al., KDD 2018) on streamrec's model
API (``streamrec.network``): the target item's embedding attends over the user's click
history, and the history weighted by that attention joins the other slots in an MLP.

Named in ``model.yaml`` as ``network: din:Din``, with this folder on PYTHONPATH.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamrec.network import NetworkInputs, NetworkNeeds


class Din:
    """Target attention over a history slot, then an MLP over every slot and the dense."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        history: str = Field("clicked_items", description="The sequence slot attended over.")
        target: str = Field("item_id", description="The slot whose embedding attends.")
        attention_sizes: list[int] = Field([36], description="The attention unit's layers.")
        fc_sizes: list[int] = Field([64, 32], min_length=1, description="The MLP's layers.")

    @staticmethod
    def needs(params: Params) -> NetworkNeeds:
        """The history must be a sequence slot, the target a pooled one."""
        return NetworkNeeds(sequences=(params.history,), pooled=(params.target,))

    def __init__(self, params: Params) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Any:
        import paddle

        p = self.params
        history = inputs.sequences[p.history]
        keys = history.values  # [batch, length, dim]
        length, dim = keys.shape[1], keys.shape[2]
        query = paddle.expand(paddle.unsqueeze(inputs.pooled[p.target], 1), [-1, length, dim])
        # the activation unit: how much each clicked item matters for this target
        unit = paddle.concat([query, keys, query - keys, query * keys], axis=-1)
        for i, width in enumerate(p.attention_sizes):
            unit = _fc(unit, width, f"din.att{i}", "sigmoid")
        weight = paddle.squeeze(_fc(unit, 1, "din.att.out"), -1) * history.mask  # [b, len]
        interest = paddle.sum(keys * paddle.unsqueeze(weight, -1), axis=1)  # [batch, dim]
        features = [*inputs.pooled.values(), interest]
        if inputs.dense is not None:
            features.append(inputs.dense)
        x = paddle.concat(features, axis=1)
        for i, width in enumerate(p.fc_sizes):
            x = _fc(x, width, f"din.fc{i}", "relu")
        return _fc(x, 1, "din.out")


def _fc(x: Any, width: int, name: str, activation: str | None = None) -> Any:
    """A dense layer over the last axis, its parameters named ``name.w`` and ``name.b``."""
    import paddle

    return paddle.static.nn.fc(
        x,
        width,
        num_flatten_dims=len(x.shape) - 1,
        activation=activation,
        weight_attr=paddle.ParamAttr(name=f"{name}.w"),
        bias_attr=paddle.ParamAttr(name=f"{name}.b"),
    )
