"""After a pass, the model's intercept refitted on the pass it has just learnt.

The model as it stands at the end of a pass is a noisy point. On the Criteo attribution
replay (10,000-row passes, two async workers) its mean prediction on the very pass it had
just trained on was off by up to 10% (in-sample COPC 0.90 to 1.09), and the next pass's
progressive COPC carried the same offset, pass for pass, while the training run's own
predictions stayed within 2% (docs/decisions/). A logistic regression's fitted intercept
makes its mean prediction on its training data equal the click rate; this step gives the
cluster's model that property on its newest pass. One more inference read of the pass
scores it as the model now stands; the shift of every logit that makes the predicted
clicks equal the actual ones is added to the bias that adds straight to the logit (each
task's ``TaskGraph.logit_bias``, each task refitted on its own label), on the servers, so
the checkpoint, the export and the next pass all hold it. A common shift of every logit
keeps their order: AUC is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from trainers.worker import dense_tables

__all__ = ["add_to_bias", "intercept_shift"]

_BRACKET = 20.0  # logits: far beyond any shift a pass with clicks and non-clicks needs


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def intercept_shift(
    pos: np.ndarray,
    neg: np.ndarray,
    tolerance: float = 1e-9,
    positives_apart: bool = False,
) -> float:
    """The shift of every logit after which the scored rows' predictions add up to their
    clicks, from the score histogram (positives and negatives per bucket, as the AUC op
    keeps them; bucket i holds scores in [i, i + 1) / buckets). With ``positives_apart``
    (an at_once label: every impression written as a negative, each positive again as a
    duplicate) the negatives are the impressions and the positives their clicks: the
    predictions over the negatives add up to the positives. 0.0 when the rows are all
    clicks or all non-clicks (no finite shift exists) or there are none."""
    pos = np.asarray(pos, dtype=np.float64).reshape(-1)
    neg = np.asarray(neg, dtype=np.float64).reshape(-1)
    clicks = float(pos.sum())
    shows = neg if positives_apart else pos + neg
    if clicks <= 0 or clicks >= float(shows.sum()):
        return 0.0
    buckets = len(pos) - 1  # the op keeps buckets + 1 counters: a score of 1.0 is its own
    centre = np.clip((np.arange(len(pos)) + 0.5) / buckets, 1e-6, 1 - 1e-6)
    logits = np.log(centre / (1 - centre))
    low, high = -_BRACKET, _BRACKET

    def excess(shift: float) -> float:  # predicted less actual clicks
        return float(np.dot(shows, _sigmoid(logits + shift))) - clicks

    # the predicted clicks grow strictly with the shift: bisection always converges
    while high - low > tolerance:
        mid = (low + high) / 2
        if excess(mid) < 0:
            low = mid
        else:
            high = mid
    shift = (low + high) / 2
    return shift if math.isfinite(shift) else 0.0


def add_to_bias(shifts: Mapping[str, float]) -> None:
    """Add each shift to its dense parameter (name -> shift: each task's bias) on the
    servers, once the pass's last updates have landed; the other dense parameters are
    written back as they are."""
    dense_tables.settle()
    values = dense_tables.pull()
    for name, shift in shifts.items():
        values[name] = values[name] + shift
    dense_tables.push(values)
