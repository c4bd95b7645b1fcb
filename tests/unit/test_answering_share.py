"""Which version answers a request: the canary and holdout shares (pure logic; stand-in
objects for the loaded versions). Each share is checked within 5 binomial standard errors
of its configured value over 40,000 seeded draws (SE <= 0.0025), and a share that is not
loaded answers nothing."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest

from serving_export.follower import ServingState

DRAWS = 40_000
BAR = 5 * (0.25 / DRAWS) ** 0.5  # 5 standard errors of a share, at its widest (p = 0.5)


def _state(*, canary: bool, held: bool) -> ServingState:
    state = ServingState()
    state.current = SimpleNamespace(version="current")
    state.canary = SimpleNamespace(version="canary") if canary else None
    state.held = SimpleNamespace(version="held") if held else None
    return state


def _shares(state: ServingState, canary_share: float, holdout_share: float) -> dict[str, float]:
    random.seed(45)
    seen = Counter(state.answering(canary_share, holdout_share).version for _ in range(DRAWS))
    return {version: n / DRAWS for version, n in seen.items()}


@pytest.mark.parametrize(("canary", "holdout"), [(0.1, 0.3), (0.5, 0.0), (0.0, 0.5)])
def test_each_share_answers_its_part_of_the_requests(canary: float, holdout: float) -> None:
    shares = _shares(_state(canary=True, held=True), canary, holdout)
    expected = {"canary": canary, "held": holdout, "current": 1 - canary - holdout}
    for version, share in expected.items():
        assert shares.get(version, 0.0) == pytest.approx(share, abs=BAR), (version, shares)


def test_a_share_with_nothing_loaded_goes_to_the_current_version() -> None:
    shares = _shares(_state(canary=False, held=True), 0.2, 0.3)
    assert set(shares) == {"held", "current"}
    assert shares["held"] == pytest.approx(0.3, abs=BAR)
    assert _shares(_state(canary=False, held=False), 0.2, 0.3) == {"current": 1.0}
