"""The delay-corrected loss's weights: at the true probability the weighted log loss of the
rows a policy writes has zero gradient, and without the weights it does not."""

from __future__ import annotations

import numpy as np
import pytest

from trainers.delay_weights import esdfm_weight, fnw_weight
from trainers.worker.intercept import intercept_shift


def _gradient(q: float, rows: list[tuple[float, float, float]]) -> float:
    """d/dlogit of sum(mass * weight * logloss(q; y)) over (mass, y, weight) rows."""
    return sum(mass * weight * (q - y) for mass, y, weight in rows)


@pytest.mark.parametrize("p", [0.01, 0.1, 0.4])
def test_fnw_weights_make_the_true_probability_the_fixed_point(p: float) -> None:
    # at_once: every impression once as a negative, each positive again as a duplicate
    rows = [(1.0, 0.0, fnw_weight(0.0, p)), (p, 1.0, fnw_weight(1.0, p))]
    assert _gradient(p, rows) == pytest.approx(0.0, abs=1e-12)
    unweighted = [(m, y, 1.0) for m, y, _ in rows]
    assert abs(_gradient(p, unweighted)) > 0.5 * p * p  # the fake negatives bias it
    # unweighted, the fixed point is p / (1 + p): the bias the weights remove
    assert _gradient(p / (1 + p), unweighted) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("p", "delayed"), [(0.05, 0.3), (0.2, 0.6), (0.5, 0.1)])
def test_esdfm_weights_make_the_true_probability_the_fixed_point(p: float, delayed: float) -> None:
    # after_wait: a row at the wait (positive if the label came by then), a duplicate for
    # a positive that came later; the delay models at their true values
    p_dp = p * delayed
    p_rn = (1 - p) / (1 - p + p_dp)
    rows = [
        (p * (1 - delayed), 1.0, esdfm_weight(1.0, p_dp, p_rn)),
        (1 - p + p_dp, 0.0, esdfm_weight(0.0, p_dp, p_rn)),
        (p_dp, 1.0, esdfm_weight(1.0, p_dp, p_rn)),
    ]
    assert _gradient(p, rows) == pytest.approx(0.0, abs=1e-12)
    unweighted = [(m, y, 1.0) for m, y, _ in rows]
    assert abs(_gradient(p, unweighted)) > 0.1 * p * p_dp


def test_the_weights_work_on_arrays() -> None:
    y = np.array([0.0, 1.0])
    p = np.array([0.2, 0.2])
    assert fnw_weight(y, p).tolist() == pytest.approx([0.96, 1.2])
    assert esdfm_weight(y, p, np.array([0.5, 0.5])).tolist() == pytest.approx([0.6, 1.2])


def test_the_refit_under_fake_negatives_finds_the_true_rate() -> None:
    """Rows written at_once with true rate 0.2, all scored 0.5: counting the impressions
    (the negatives) against their positives (the duplicates) moves the intercept to the
    true rate; a plain refit to the rows' rate, p / (1 + p)."""
    buckets, p, n = 4095, 0.2, 100_000
    pos, neg = np.zeros(buckets + 1), np.zeros(buckets + 1)
    middle = buckets // 2
    neg[middle], pos[middle] = n, n * p  # every impression a negative, each positive again

    def refitted(apart: bool) -> float:
        centre = (middle + 0.5) / buckets
        logit = np.log(centre / (1 - centre)) + intercept_shift(pos, neg, positives_apart=apart)
        return float(1 / (1 + np.exp(-logit)))

    assert refitted(True) == pytest.approx(p, abs=1e-6)
    assert refitted(False) == pytest.approx(p / (1 + p), abs=1e-6)


def test_fnw_alone_calibrates_a_misfit_model_only_where_it_is_right() -> None:
    """Why the refit counts the duplicates instead of solving the FNW-weighted sums: at a
    shared bias the FNW loss's gradient is sum (1 - q^2)(p - q) (each row's weight at the
    model's own probability), a calibration weighted towards low scores; a model whose
    slope is off then predicts more clicks than come."""
    rng = np.random.default_rng(0)
    p = rng.uniform(0.02, 0.6, 200_000)
    logit = np.log(p / (1 - p)) * 1.6  # too confident: q spreads wider than p

    def q_of(shift: float) -> np.ndarray:
        return 1 / (1 + np.exp(-(logit + shift)))

    low, high = -5.0, 5.0
    for _ in range(60):  # the bias where the FNW gradient vanishes
        mid = (low + high) / 2
        q = q_of(mid)
        if np.sum((1 - q**2) * (p - q)) > 0:
            low = mid
        else:
            high = mid
    copc = p.sum() / q_of(low).sum()
    assert copc < 0.99  # over-predicts: what the cluster showed (0.90-0.98) before
