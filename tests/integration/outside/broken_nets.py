"""Networks that must fail a cluster's start (exit 2, the key named)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamrec.network import NetworkInputs


class WrongShape:
    """Returns ``width`` logits per row: the model API asks for one."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        width: int = Field(1, ge=1)

    def __init__(self, params: Params) -> None:
        self.width = params.width

    def logit(self, inputs: NetworkInputs) -> Any:
        import paddle

        return paddle.static.nn.fc(paddle.concat(list(inputs.pooled.values()), axis=1), self.width)
