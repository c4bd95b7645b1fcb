"""An ESMM-style network (Entire Space Multi-task Model, Ma et al., SIGIR 2018) on
streamrec's model API (``streamrec.network.MultiTaskNetwork``): a CTR tower and a CVR tower
over the same embeddings, trained on every impression through

    p(click) = sigmoid(ctr)        p(click and conversion) = p(click) * sigmoid(cvr)

so the CVR tower learns p(conversion | click) without ever being trained on the clicked
rows alone (the sample-selection bias ESMM was made to avoid). The conversion task's logit
is that product's, ``log p - log(1 - p)``, computed from log-probabilities.

Named in ``model_esmm.yaml`` as ``network: esmm:Esmm``, with this folder on PYTHONPATH.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamrec.network import NetworkInputs, NetworkNeeds, mlp, slot_vectors, with_dense

# p(click and conversion) stays below 1 - 1e-6, so its logit stays finite
_LOG_P_MAX = math.log1p(-1e-6)


class Esmm:
    """Shared embeddings, a CTR and a CVR MLP; the conversion head is their product."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        click: str = Field("click", description="The click label's name.")
        conversion: str = Field("conversion", description="The conversion label's name.")
        fc_sizes: list[int] = Field([64, 32], min_length=1, description="Each tower's layers.")

    @staticmethod
    def needs(params: Params) -> NetworkNeeds:
        """It heads the click and the conversion labels."""
        return NetworkNeeds(labels=(params.click, params.conversion))

    def __init__(self, params: Params) -> None:
        self.params = params

    def logits(self, inputs: NetworkInputs) -> dict[str, Any]:
        import paddle

        p = self.params
        features = with_dense(slot_vectors(inputs), inputs.dense)
        x = paddle.concat(features, axis=1)
        ctr = mlp(x, p.fc_sizes, "esmm.ctr")
        cvr = mlp(x, p.fc_sizes, "esmm.cvr")
        softplus = paddle.nn.functional.softplus
        log_p = paddle.clip(-softplus(-ctr) - softplus(-cvr), max=_LOG_P_MAX)
        ctcvr = log_p - paddle.log(1.0 - paddle.exp(log_p))
        return {p.click: ctr, p.conversion: ctcvr}
