"""Metric maths against naive oracles; merging per-worker sums equals one big evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainers.metrics import bucket_auc, bucket_error, bucketize, exact_auc, metrics_from_stats

BUCKETS = 4095


def _naive_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _sums(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    q = np.clip(p, 1e-7, 1 - 1e-7)
    return {
        "count": len(p),
        "clicks": y.sum(),
        "pred_sum": p.sum(),
        "logloss_sum": -(y * np.log(q) + (1 - y) * np.log(1 - q)).sum(),
        "abs_err_sum": np.abs(y - p).sum(),
        "sq_err_sum": ((y - p) ** 2).sum(),
    }


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    p = rng.random(600)
    y = (rng.random(600) < p).astype(np.int64)
    return p, y


def test_exact_auc_equals_the_pairwise_oracle(data) -> None:
    p, y = data
    assert exact_auc(p, y) == pytest.approx(_naive_auc(p, y), abs=1e-12)
    ties = np.round(p, 1)
    assert exact_auc(ties, y) == pytest.approx(_naive_auc(ties, y), abs=1e-12)


def test_bucketed_auc_is_the_auc_of_bucketed_scores(data) -> None:
    p, y = data
    pos, neg = bucketize(p, y, BUCKETS)
    bucketed = np.clip((p * BUCKETS).astype(int), 0, BUCKETS)
    assert bucket_auc(pos, neg) == pytest.approx(_naive_auc(bucketed, y), abs=1e-9)
    assert bucket_auc(pos, neg) == pytest.approx(exact_auc(p, y), abs=2e-3)


def test_metrics_from_sums_equal_direct_formulas(data) -> None:
    p, y = data
    pos, neg = bucketize(p, y, BUCKETS)
    m = metrics_from_stats(pos, neg, _sums(p, y))
    q = np.clip(p, 1e-7, 1 - 1e-7)
    assert m.count == 600
    assert m.logloss == pytest.approx(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)), abs=1e-6)
    assert m.copc == pytest.approx(y.sum() / p.sum(), abs=1e-6)
    assert m.mae == pytest.approx(np.mean(np.abs(y - p)), abs=1e-6)
    assert m.rmse == pytest.approx(math.sqrt(np.mean((y - p) ** 2)), abs=1e-6)


def _naive_bucket_error(scores: np.ndarray, labels: np.ndarray, buckets: int) -> float:
    """Pools of samples (not sums) walked bucket by bucket, as bucket_error defines them."""
    by_bucket: dict[int, list[int]] = {}
    for s, y in zip(scores, labels, strict=True):
        by_bucket.setdefault(min(int(s * buckets), buckets), []).append(int(y))
    errors, weights = [], []
    pool: list[tuple[float, int]] = []
    start = -1.0
    for b in sorted(by_bucket):
        if b / buckets - start > 0.01:
            start, pool = b / buckets, []
        pool += [(b / buckets, y) for y in by_bucket[b]]
        predicted = sum(v for v, _ in pool) / len(pool)
        if predicted > 0 and math.sqrt((1 - predicted) / (predicted * len(pool))) < 0.05:
            errors.append(abs(sum(y for _, y in pool) / len(pool) / predicted - 1) * len(pool))
            weights.append(len(pool))
            start = -1.0
    return sum(errors) / sum(weights) if weights else 0.0


def _ctr_sample(n: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from CTR-like probabilities; scores are ``scale`` times those."""
    rng = np.random.default_rng(1)
    p = rng.beta(2, 20, n)
    return np.clip(p * scale, 0, 1), (rng.random(n) < p).astype(np.int64)


def test_bucket_error_equals_the_pooled_samples_oracle() -> None:
    for scale in (1.0, 0.5, 1.3):
        scores, labels = _ctr_sample(50_000, scale)
        pos, neg = bucketize(scores, labels, BUCKETS)
        assert bucket_error(pos, neg) == pytest.approx(
            _naive_bucket_error(scores, labels, BUCKETS), abs=1e-6
        )


def test_bucket_error_sees_miscalibration_copc_misses() -> None:
    calibrated = bucket_error(*bucketize(*_ctr_sample(400_000, 1.0), BUCKETS))
    halved = bucket_error(*bucketize(*_ctr_sample(400_000, 0.5), BUCKETS))
    assert calibrated < 0.05
    assert halved == pytest.approx(1.0, abs=0.1)  # actual CTR twice the predicted
    # over- and under-prediction that cancel in COPC: bucket error still sees both
    scores, labels = _ctr_sample(400_000, 1.0)
    twisted = np.where(scores < 0.12, scores * 0.7, np.minimum(scores * 1.3, 1.0))
    assert labels.sum() / twisted.sum() == pytest.approx(1.0, abs=0.01)
    assert bucket_error(*bucketize(twisted, labels, BUCKETS)) > 0.3
    assert bucket_error(np.zeros(8), np.zeros(8)) == 0.0


def test_summing_worker_stats_equals_one_evaluation(data) -> None:
    p, y = data
    shards = [(p[i::3], y[i::3]) for i in range(3)]  # three workers
    pos = sum(bucketize(a, b, BUCKETS)[0] for a, b in shards)
    neg = sum(bucketize(a, b, BUCKETS)[1] for a, b in shards)
    sums = {k: sum(_sums(a, b)[k] for a, b in shards) for k in _sums(p, y)}
    merged = metrics_from_stats(pos, neg, sums)
    single = metrics_from_stats(*bucketize(p, y, BUCKETS), _sums(p, y))
    for field, value in single.to_dict().items():
        assert getattr(merged, field) == pytest.approx(value, abs=1e-9), field


def test_degenerate_inputs() -> None:
    assert exact_auc(np.array([0.2, 0.9]), np.array([1, 1])) == 0.5
    empty = metrics_from_stats(
        np.zeros(4),
        np.zeros(4),
        {
            k: 0.0
            for k in ("count", "clicks", "pred_sum", "logloss_sum", "abs_err_sum", "sq_err_sum")
        },
    )
    assert empty.count == 0 and math.isnan(empty.auc) and math.isnan(empty.bucket_error)
