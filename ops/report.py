"""One self-contained HTML page about recent passes: inline SVG plots, no scripts, no server.

Plots (one point per pass that has the figure): progressive AUC against the stream's best
reachable AUC where known, logloss, COPC, rows, freshness and table size; then the status
table. Each point carries a ``<title>`` with the pass and the value, shown on hover.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ops.status import PassRow

WIDTH, HEIGHT, PAD = 640, 220, 48
COLORS = ("#1f77b4", "#d62728")


@dataclass(frozen=True)
class Series:
    label: str
    value: Callable[[PassRow], float | None]


@dataclass(frozen=True)
class Plot:
    title: str
    series: tuple[Series, ...]
    unit: str = ""


PLOTS = (
    Plot(
        "Progressive AUC (before training on the pass)",
        (Series("AUC", lambda r: r.auc), Series("best reachable", lambda r: r.best_auc)),
    ),
    Plot("Logloss", (Series("logloss", lambda r: r.logloss),)),
    Plot("COPC (clicks / predicted clicks)", (Series("COPC", lambda r: r.copc),)),
    Plot("Rows per pass", (Series("rows", lambda r: r.rows),)),
    Plot(
        "Freshness (serving time - window end)",
        (Series("freshness", lambda r: r.freshness_seconds),),
        " s",
    ),
    Plot("Sparse table size", (Series("keys", lambda r: r.table_keys),)),
)


def _svg(plot: Plot, rows: list[PassRow]) -> str:
    points = [
        [(i, v) for i, r in enumerate(rows) if (v := s.value(r)) is not None and math.isfinite(v)]
        for s in plot.series
    ]
    values = [v for series in points for _, v in series]
    if not values:
        return f'<p class="empty">{html.escape(plot.title)}: no pass has this figure yet.</p>'
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 1, high + 1
    n = max(len(rows) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        x = PAD + (WIDTH - 2 * PAD) * i / n
        y = HEIGHT - PAD + (2 * PAD - HEIGHT) * (v - low) / (high - low)
        return round(x, 1), round(y, 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{html.escape(plot.title)}">',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
        'stroke="#999"/>',
        f'<line x1="{PAD}" y1="{PAD / 2}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>',
        f'<text x="4" y="{PAD / 2 + 4}" font-size="11">{high:.4g}</text>',
        f'<text x="4" y="{HEIGHT - PAD}" font-size="11">{low:.4g}</text>',
        f'<text x="{PAD}" y="{HEIGHT - PAD + 16}" font-size="11">{rows[0].pass_id}</text>',
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 16}" font-size="11" '
        f'text-anchor="end">{rows[-1].pass_id}</text>',
    ]
    for k, (series, pts) in enumerate(zip(plot.series, points, strict=True)):
        color = COLORS[k % len(COLORS)]
        coords = [xy(i, v) for i, v in pts]
        if len(coords) > 1:
            path = " ".join(f"{x},{y}" for x, y in coords)
            parts.append(f'<polyline fill="none" stroke="{color}" points="{path}"/>')
        for (i, v), (x, y) in zip(pts, coords, strict=True):
            tip = html.escape(f"{rows[i].pass_id} {series.label}: {v:.6g}{plot.unit}")
            parts.append(
                f'<circle class="point" data-series="{html.escape(series.label)}" cx="{x}" '
                f'cy="{y}" r="3" fill="{color}"><title>{tip}</title></circle>'
            )
        parts.append(
            f'<text x="{WIDTH - PAD}" y="{14 + 14 * k}" font-size="11" fill="{color}" '
            f'text-anchor="end">{html.escape(series.label)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render(
    pipeline: str, rows: list[PassRow], table: str, generated: datetime | None = None
) -> str:
    """The report page for ``rows`` (oldest first) with ``table`` (the status table)."""
    when = (generated or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S UTC")
    sections = "\n".join(
        f"<section><h2>{html.escape(p.title)}</h2>\n{_svg(p, rows)}</section>" for p in PLOTS
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>streamrec {html.escape(pipeline)}: passes</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
section {{ display: inline-block; vertical-align: top; margin: 0 1em 1em 0; }}
h2 {{ font-size: 1em; margin: 0.3em 0; }}
pre {{ font-size: 12px; background: #f6f6f6; padding: 1em; overflow-x: auto; }}
</style></head>
<body>
<h1>streamrec pipeline <code>{html.escape(pipeline)}</code></h1>
<p>{len(rows)} passes, {rows[0].pass_id if rows else "-"} to {rows[-1].pass_id if rows else "-"};
generated {when}. AUC, logloss and COPC are progressive: the model before the pass, scored
on the pass.</p>
{sections}
<h2>Status</h2>
<pre>{html.escape(table)}</pre>
</body></html>
"""
