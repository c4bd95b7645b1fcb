"""Pure metric maths on sums that add up across workers.

Each worker keeps AUC buckets (positives and negatives per predicted-probability bucket)
and plain sums; the cluster all-reduces them (sum) and calls ``metrics_from_stats`` once.
``exact_auc`` is the rank-based oracle the bucketed AUC is tested against.
"""

from __future__ import annotations

import math

import numpy as np

from streamrec.auc import exact_auc
from streamrec.contracts.training import PassMetrics

__all__ = [
    "STAT_NAMES",
    "PassMetrics",
    "bucket_auc",
    "bucket_error",
    "bucketize",
    "exact_auc",
    "metrics_from_stats",
    "stats_from_predictions",
]

STAT_NAMES = ("count", "clicks", "pred_sum", "logloss_sum", "abs_err_sum", "sq_err_sum")


def bucket_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC from per-bucket positive/negative counts (bucket i = score rank i)."""
    pos = np.asarray(pos, dtype=np.float64).reshape(-1)[::-1]
    neg = np.asarray(neg, dtype=np.float64).reshape(-1)[::-1]
    tp = np.cumsum(pos)
    fp = np.cumsum(neg)
    if tp[-1] == 0 or fp[-1] == 0:
        return 0.5
    tp_prev = np.concatenate([[0.0], tp[:-1]])
    return float(np.sum(neg * (tp + tp_prev) / 2.0) / (tp[-1] * fp[-1]))


def bucket_error(
    pos: np.ndarray, neg: np.ndarray, max_span: float = 0.01, error_bound: float = 0.05
) -> float:
    """Calibration error across score ranges (the online-CTR "bucket error").

    Walking the score buckets upwards, consecutive buckets are pooled until the pool holds
    enough samples to estimate its predicted CTR c to a relative standard error
    sqrt((1 - c) / (c n)) below ``error_bound``; a pool spanning more than ``max_span`` of
    score restarts. Each closed pool contributes |actual CTR / predicted CTR - 1|, weighted
    by its samples. 0.0 when no pool ever gets enough samples.
    """
    pos = np.asarray(pos, dtype=np.float64).reshape(-1)
    shows = pos + np.asarray(neg, dtype=np.float64).reshape(-1)
    buckets = len(shows)
    error_sum = weight = 0.0
    start = -1.0
    n = score_sum = clicks = 0.0
    for i in np.flatnonzero(shows):
        score = i / buckets
        if score - start > max_span:
            start, n, score_sum, clicks = score, 0.0, 0.0, 0.0
        n += shows[i]
        score_sum += score * shows[i]
        clicks += pos[i]
        predicted = score_sum / n
        if predicted > 0 and math.sqrt((1 - predicted) / (predicted * n)) < error_bound:
            error_sum += abs(clicks / n / predicted - 1) * n
            weight += n
            start = -1.0
    return error_sum / weight if weight else 0.0


def bucketize(
    scores: np.ndarray, labels: np.ndarray, buckets: int
) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative counts per score bucket, as Paddle's auc op keeps them."""
    idx = np.clip((np.asarray(scores) * buckets).astype(np.int64), 0, buckets)
    labels = np.asarray(labels).reshape(-1)
    pos = np.bincount(idx[labels == 1], minlength=buckets + 1)
    neg = np.bincount(idx[labels == 0], minlength=buckets + 1)
    return pos, neg


def stats_from_predictions(
    scores: np.ndarray, labels: np.ndarray, buckets: int
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """AUC buckets and sums (keys: STAT_NAMES) of scored instances, as the graph's
    accumulators keep them: ``metrics_from_stats`` of their totals is the metrics."""
    p = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    q = np.clip(p, 1e-7, 1 - 1e-7)
    pos, neg = bucketize(p, y, buckets)
    sums = {
        "count": float(len(p)),
        "clicks": float(y.sum()),
        "pred_sum": float(p.sum()),
        "logloss_sum": float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).sum()),
        "abs_err_sum": float(np.abs(y - p).sum()),
        "sq_err_sum": float(np.square(y - p).sum()),
    }
    return pos, neg, sums


def metrics_from_stats(pos: np.ndarray, neg: np.ndarray, sums: dict[str, float]) -> PassMetrics:
    """Metrics from summed buckets and sums (keys: STAT_NAMES)."""
    n = sums["count"]
    if n <= 0:
        nan = math.nan
        return PassMetrics(0, nan, nan, nan, nan, nan, nan, nan, nan)
    return PassMetrics(
        count=round(n),
        auc=bucket_auc(pos, neg),
        logloss=sums["logloss_sum"] / n,
        copc=sums["clicks"] / sums["pred_sum"] if sums["pred_sum"] > 0 else math.nan,
        mae=sums["abs_err_sum"] / n,
        rmse=math.sqrt(sums["sq_err_sum"] / n),
        actual_ctr=sums["clicks"] / n,
        predicted_ctr=sums["pred_sum"] / n,
        bucket_error=bucket_error(pos, neg),
    )
