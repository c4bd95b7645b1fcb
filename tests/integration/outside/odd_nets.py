"""A network with an operator paddle2onnx 1.3.1 cannot convert (``logcumsumexp``): its
artifact must carry the Paddle program alone, and serving must score it there."""

from __future__ import annotations

from typing import Any

from streamrec.network import NetworkInputs


class SoftRanked:
    """A linear logit over the slots' vectors and a running log-sum-exp across them."""

    def __init__(self, params: Any) -> None:
        self.params = params

    def logit(self, inputs: NetworkInputs) -> Any:
        import paddle

        x = paddle.concat(list(inputs.pooled.values()), axis=1)
        running = paddle.logcumsumexp(x, axis=1)
        features = paddle.concat([x, running], axis=1)
        return paddle.static.nn.fc(
            features,
            1,
            weight_attr=paddle.ParamAttr(name="soft.out.w"),
            bias_attr=paddle.ParamAttr(name="soft.out.b"),
        )
