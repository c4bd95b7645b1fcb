"""`streamrec report`'s page in headless Chromium, on rows made here: every plot is drawn
with its axes (tick labels, axis labels), a titled point per pass, and no page error.
The same check on a live pipeline's report is in test_airflow_scheduler.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from browser import open_page

from ops.report import X_LABEL, plots, render
from ops.status import PassRow, format_table, stale_after_seconds
from streamrec.passes import PassClock

TARGET = stale_after_seconds(PassClock(60))


def _rows(n: int) -> list[PassRow]:
    return [
        PassRow(
            pass_id=f"2026010100{i:02d}",
            window_end=0.0,
            complete=True,
            rows=18_000 + 37 * i,
            trained=True,
            auc=0.70 + i / 1000,
            best_auc=0.78,
            logloss=0.48,
            copc=1.0 + (-1) ** i * 0.02,
            table_keys=5_000 + 700 * i,
            freshness_seconds=23.0 + i / 20,
        )
        for i in range(n)
    ]


def test_every_plot_is_drawn_with_its_axes_and_no_page_error(tmp_path: Path) -> None:
    rows = _rows(16)
    out = tmp_path / "report.html"
    out.write_text(render("demo", rows, format_table(rows), TARGET))
    page = open_page(out)
    assert page.errors == []
    wanted = plots(TARGET)
    assert [c.label for c in page.charts] == [p.title for p in wanted]
    ids = {r.pass_id for r in rows}
    for plot, chart in zip(wanted, page.charts, strict=True):
        assert chart.width > 200 and chart.height > 100, plot.title
        assert 2 < len(chart.x_ticks) < len(rows) and set(chart.x_ticks) <= ids, plot.title
        assert len(chart.y_ticks) >= 3, plot.title
        assert chart.x_label == [X_LABEL] and chart.y_label == [plot.y_label], plot.title
        assert chart.points == chart.titled == len(rows) * len(plot.metrics), plot.title
    freshness = page.charts[4]
    assert (
        freshness.y_ticks[0] == "0" and f"target: two windows ({TARGET:.0f} s)" in freshness.texts
    )


def test_fresh_and_matured_figures_are_drawn_side_by_side_and_named(tmp_path: Path) -> None:
    """Labels written before their window closed: each pass's fresh AUC and COPC (on the
    labels it trained with) beside its matured ones (on the final labels), the newest two
    passes not matured yet, so their matured points are missing, not zero."""
    rows = [
        replace(r, matured_auc=r.auc + 0.03, matured_copc=1.0, judged_in=f"later{i}")
        if i < 14
        else r
        for i, r in enumerate(_rows(16))
    ]
    out = tmp_path / "report.html"
    out.write_text(render("fresh", rows, format_table(rows), TARGET))
    page = open_page(out)
    assert page.errors == []
    wanted = plots(TARGET, matured=True)
    assert [c.label for c in page.charts] == [p.title for p in wanted]
    for plot, chart in zip(wanted, page.charts, strict=True):
        drawn = sum(m.value(r) is not None for m in plot.metrics for r in rows)
        assert chart.points == chart.titled == drawn, plot.title
    auc, copc = page.charts[0], page.charts[2]
    assert {"fresh AUC", "matured AUC"} <= set(auc.texts)
    assert {"fresh COPC", "matured COPC"} <= set(copc.texts)
    assert sum(m.value(r) is None for m in wanted[0].metrics for r in rows) == 2
