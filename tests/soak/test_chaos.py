"""The short chaos soak that CI runs: every kind of fault once, on real services, and
nothing lost, repeated, out of order or half-served (the long one, on demand:
``.venv/bin/python tests/soak/chaos.py --passes 30``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos import FAULTS, run_soak

pytestmark = pytest.mark.slow

PASSES = 10  # one every 15 s: time for all eight kinds of fault, one after another


@pytest.mark.timeout(1200)  # 4.3 min alone on the 2-core machine, 7.6 in a suite before
def test_every_fault_recovered_and_nothing_lost(tmp_path: Path) -> None:
    report = run_soak(tmp_path, passes=PASSES, seed=13, pace_s=15)
    # every kind injected and recovered, and everything SoakReport.problems lists held
    assert report.problems == []
    assert len(report.faults) >= len(FAULTS)
    assert report.requests.get("answered", 0) > 0
