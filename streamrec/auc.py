"""The exact, rank-based ROC AUC: the oracle for bucketed metrics and the synthetic
stream's best reachable AUC. Pure numpy."""

from __future__ import annotations

import numpy as np


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Rank-based ROC AUC (ties count one half): the oracle."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    n_pos = int((labels == 1).sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg_rank = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg_rank, counts)
    return float((ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
