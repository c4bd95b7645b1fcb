"""An MMoE-style network (Multi-gate Mixture-of-Experts, Ma et al., KDD 2018) on
streamrec's model API (``streamrec.network.MultiTaskNetwork``): a few expert MLPs over the
shared embeddings, and per task a softmax gate that mixes them and a tower on the mix.
Each task is trained on every impression with its own label, so the conversion head
predicts p(click and conversion); p(conversion | click) is its ratio to the click head's.

Named in ``model_mmoe.yaml`` as ``network: mmoe:Mmoe``, with this folder on PYTHONPATH.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamrec.network import NetworkInputs, NetworkNeeds, mlp, slot_vectors, with_dense


class Mmoe:
    """``experts`` expert layers, a gate and a tower per task (label)."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        tasks: list[str] = Field(
            ["click", "conversion"], min_length=1, description="The labels it heads."
        )
        experts: int = Field(4, ge=1, description="Expert layers shared by the tasks.")
        expert_size: int = Field(32, ge=1, description="Each expert's width.")
        tower_sizes: list[int] = Field([16], min_length=1, description="Each task's tower.")

    @staticmethod
    def needs(params: Params) -> NetworkNeeds:
        """It heads the labels of ``tasks``."""
        return NetworkNeeds(labels=tuple(params.tasks))

    def __init__(self, params: Params) -> None:
        self.params = params

    def logits(self, inputs: NetworkInputs) -> dict[str, Any]:
        import paddle

        p = self.params
        features = with_dense(slot_vectors(inputs), inputs.dense)
        x = paddle.concat(features, axis=1)
        experts = paddle.stack(
            [
                paddle.static.nn.fc(
                    x,
                    p.expert_size,
                    activation="relu",
                    weight_attr=paddle.ParamAttr(name=f"mmoe.expert{i}.w"),
                    bias_attr=paddle.ParamAttr(name=f"mmoe.expert{i}.b"),
                )
                for i in range(p.experts)
            ],
            axis=1,
        )  # [batch, experts, expert_size]
        out = {}
        for task in p.tasks:
            gate = paddle.static.nn.fc(
                x,
                p.experts,
                activation="softmax",
                weight_attr=paddle.ParamAttr(name=f"mmoe.{task}.gate.w"),
                bias_attr=paddle.ParamAttr(name=f"mmoe.{task}.gate.b"),
            )
            mixed = paddle.sum(experts * paddle.unsqueeze(gate, -1), axis=1)
            out[task] = mlp(mixed, p.tower_sizes, f"mmoe.{task}")
        return out
