"""Online metrics' maths: windows sum exactly, a comparison reads only the windows both
versions answered, and the alarm's rule (pure logic on numpy statistics)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ops.online import Comparison, OnlineStats, by_version, compare
from trainers.metrics import exact_auc, stats_from_predictions
from trainers.models import AUC_BUCKETS


def _stats(p: np.ndarray, y: np.ndarray) -> OnlineStats:
    return OnlineStats(*stats_from_predictions(p, y, AUC_BUCKETS))


def _window(rng: np.random.Generator, n: int, signal: float) -> tuple[np.ndarray, np.ndarray]:
    """n scored events whose labels follow the scores more (signal 1) or not at all (0)."""
    p = rng.uniform(0.02, 0.5, n)
    truth = signal * p + (1 - signal) * rng.uniform(0.02, 0.5, n)
    return p, (rng.uniform(size=n) < truth).astype(np.int8)


def test_windows_sum_to_the_metrics_of_all_their_rows() -> None:
    rng = np.random.default_rng(7)
    windows = {f"20261128000{i}": _window(rng, 3000, 1.0) for i in range(3)}
    stats = {w: {"v1": {"click": _stats(p, y)}} for w, (p, y) in windows.items()}
    [summed] = by_version(stats)
    p = np.concatenate([p for p, _ in windows.values()])
    y = np.concatenate([y for _, y in windows.values()])
    whole = _stats(p, y).metrics()
    assert summed.count == 9000 and summed.windows == sorted(windows)
    assert (summed.auc, summed.logloss, summed.copc) == pytest.approx(
        (whole.auc, whole.logloss, whole.copc), rel=1e-12
    )
    # the buckets' AUC is the exact one to within the buckets' width
    assert summed.auc == pytest.approx(exact_auc(p, y), abs=2e-3)


def test_a_comparison_reads_only_the_windows_both_versions_answered() -> None:
    rng = np.random.default_rng(3)
    good, bad = _window(rng, 2000, 1.0), _window(rng, 2000, 0.0)
    only_v1 = _window(rng, 2000, 0.0)
    stats = {
        "202611280000": {"v1": {"click": _stats(*only_v1)}},  # before v2 served: left out
        "202611280001": {"v1": {"click": _stats(*good)}, "v2": {"click": _stats(*bad)}},
    }
    c = compare(stats, "v2", "v1", "click")
    assert c.windows == ["202611280001"] and (c.count, c.baseline_count) == (2000, 2000)
    assert c.auc == pytest.approx(exact_auc(*bad), abs=2e-3)
    assert c.baseline_auc == pytest.approx(exact_auc(*good), abs=2e-3)
    assert c.drop > 0.1 and c.enough(2000) and not c.enough(2001)
    nothing = compare(stats, "v3", "v1", "click")
    assert nothing.windows == [] and math.isnan(nothing.drop) and not nothing.enough(1)


def test_a_comparison_without_a_shared_window_is_never_worse() -> None:
    c = Comparison("v2", "v1", "click")
    assert not c.drop > 0  # NaN: the alarm's rule (drop > margin) cannot fire
