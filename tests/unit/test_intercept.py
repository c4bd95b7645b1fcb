"""The intercept shift solved from a score histogram (trainers.worker.intercept)."""

from __future__ import annotations

import numpy as np
import pytest

from trainers.metrics import bucketize
from trainers.worker.intercept import intercept_shift

BUCKETS = 4095  # as the models' AUC op keeps them


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1 - p))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def _histogram(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return bucketize(scores, labels, BUCKETS)


@pytest.mark.parametrize("true_shift", [-0.6, -0.1, 0.0, 0.25, 1.0])
def test_the_shift_that_made_the_labels_is_recovered(true_shift: float) -> None:
    rng = np.random.default_rng(3)
    scores = rng.beta(2, 4, 400_000)  # predictions spread over 0.0-0.9, mean 1/3
    labels = (rng.random(len(scores)) < _sigmoid(_logit(scores) + true_shift)).astype(int)
    shift = intercept_shift(*_histogram(scores, labels))
    assert shift == pytest.approx(true_shift, abs=0.02)


def test_after_the_shift_the_predicted_clicks_are_the_clicks() -> None:
    rng = np.random.default_rng(5)
    scores = rng.uniform(0.05, 0.7, 50_000)
    labels = (rng.random(len(scores)) < 0.3).astype(int)  # over-predicted: mean score 0.375
    pos, neg = _histogram(scores, labels)
    shift = intercept_shift(pos, neg)
    assert shift < 0
    shifted = _sigmoid(_logit(scores) + shift)
    # exact on the bucket centres it solved on; within bucket width on the raw scores
    assert shifted.sum() == pytest.approx(labels.sum(), rel=2e-3)


@pytest.mark.parametrize(
    ("pos", "neg"),
    [
        ([0, 0, 0], [0, 0, 0]),  # no rows
        ([0, 0, 0], [5, 3, 1]),  # no clicks: no finite shift
        ([2, 4, 6], [0, 0, 0]),  # every row clicked
    ],
)
def test_no_finite_shift_leaves_the_bias(pos: list[int], neg: list[int]) -> None:
    assert intercept_shift(np.array(pos), np.array(neg)) == 0.0
