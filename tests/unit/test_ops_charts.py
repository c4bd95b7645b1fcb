"""ops.charts: axis ranges, and the inline SVG matplotlib draws (no browser: that is
tests/integration/test_report_browser.py)."""

from __future__ import annotations

import re

import pytest

from ops.charts import ReferenceLine, Series, YRange, line_chart, y_limits


def test_a_small_spread_is_not_stretched_to_the_full_height() -> None:
    low, high = y_limits([22.9, 23.7], YRange(floor=0.0), [120.0])  # freshness, its target
    assert low == 0 and 120 < high < 130
    low, high = y_limits([0.98, 1.02], YRange(min_span=0.2), [1.0])  # COPC around 1
    assert low < 0.9 and high > 1.1
    low, high = y_limits([17_000, 18_500], YRange(floor=0.0))  # counts start at 0
    assert low == 0 and high > 18_500
    low, _ = y_limits([-3.0, 5.0], YRange(floor=0.0))  # data below the floor stays in view
    assert low < -3
    low, high = y_limits([7.0], YRange())  # one value: room around it
    assert low < 7 < high


def _texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_numeric_x_on_log_axes_with_several_series() -> None:
    """The shape of a benchmark chart: offered events/s against latency, two series."""
    offered = [1_000.0, 2_000.0, 4_000.0, 8_000.0, 16_000.0]
    series = [
        Series("p50", [1.2, 1.3, 1.5, 2.4, None]),  # None: the run at 16k failed
        Series("p99", [3.0, 3.4, 4.1, 9.5, 30.0]),
    ]

    def draw() -> str:
        return line_chart(
            "sweep",
            "Latency under offered load",
            offered,
            series,
            x_label="offered events/s",
            y_label="latency (ms)",
            references=[ReferenceLine(10.0, "p99 budget (10 ms)")],
            x_scale="log",
            y_scale="log",
            unit=" ms",
        )

    svg = draw()
    assert svg.startswith("<svg") and "<?xml" not in svg
    texts = _texts(svg)
    for text in ("offered events/s", "latency (ms)", "p50", "p99", "p99 budget (10 ms)"):
        assert text in texts
    points = re.findall(r'<g id="([^"]+)" class="point" data-series="([^"]+)">', svg)
    assert [s for _, s in points].count("p50") == 4 and [s for _, s in points].count("p99") == 5
    assert all(i.startswith("sweep-") for i in re.findall(r'\bid="([^"]+)"', svg))
    assert "<title>8000 p99: 9.5 ms</title>" in svg
    again = draw()
    assert again == svg  # deterministic: reports diff cleanly


def test_many_categories_are_thinned_but_not_only_the_ends() -> None:
    ids = [f"2026010100{i:02d}" for i in range(40)]
    svg = line_chart(
        "rows",
        "Rows per pass",
        ids,
        [Series("rows", [1000.0 + i for i in range(40)])],
        x_label="pass",
        y_label="rows",
        y_range=YRange(floor=0.0),
    )
    shown = [t for t in _texts(svg) if t in ids]
    assert 2 < len(shown) <= 10 and ids[0] in shown
    assert "rows" in _texts(svg) and svg.count('class="point"') == 40


def test_nothing_to_plot_is_an_error() -> None:
    with pytest.raises(ValueError, match="no series"):
        line_chart("x", "Empty", ["a"], [Series("s", [None])], x_label="x", y_label="y")
