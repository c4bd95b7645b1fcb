"""Line charts drawn by matplotlib as inline SVG strings: no scripts, no files, no server.

``line_chart`` draws one chart: categorical x (pass ids, one tick label per few passes) or
numeric x (offered events/s, table keys; log axes allowed), one line per ``Series``, a
legend when there are several, and ``ReferenceLine`` s drawn and labelled (a target, chance,
calibration). ``YRange`` keeps a small spread from filling the height: counts start at 0,
COPC always shows 1 with some room either side.

The SVG inlines in HTML: no XML prolog, text kept as text (``svg.fonttype: none``), and
every ``id`` prefixed by the chart's id so several charts share a page. Each point is a
``<g class="point" data-series=LABEL>`` holding a ``<title>`` the browser shows on hover.
The output is deterministic (``svg.hashsalt`` is the chart id, no date in the metadata).
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

Scale = Literal["linear", "log"]

FIGSIZE = (6.0, 3.2)  # inches; 72 pt each in SVG, two charts side by side on a laptop screen
MAX_CATEGORY_TICKS = 8  # labelled pass ids on one axis, thinned by MaxNLocator beyond that
_RC: dict[Any, Any] = {  # matplotlib types its keys as a Literal of every rc name
    "svg.fonttype": "none",  # text stays <text>, so it is selectable and the browser draws it
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}


@dataclass(frozen=True)
class Series:
    """One line: a value per x (None or not finite: no point there) and its legend label."""

    label: str
    values: Sequence[float | None]


@dataclass(frozen=True)
class ReferenceLine:
    """A horizontal line at ``value`` with ``label`` written on it; the y axis includes it."""

    value: float
    label: str


@dataclass(frozen=True)
class YRange:
    """How a linear y axis is chosen: the data, widened to at least ``min_span`` around its
    middle and to take in ``include`` and every reference line, then padded by ``pad`` of
    that span; the bottom is ``floor`` itself unless the data goes below it. ``floor=0``
    makes counts start at 0; ``min_span`` keeps a spread of 0.02 from looking like a swing.
    A log axis is left to matplotlib's autoscaling."""

    floor: float | None = None
    include: tuple[float, ...] = ()
    min_span: float = 0.0
    pad: float = 0.05


def y_limits(
    values: Sequence[float], y_range: YRange, references: Sequence[float] = ()
) -> tuple[float, float]:
    """The y axis limits for ``values`` (at least one, all finite) under ``y_range``."""
    middle = (min(values) + max(values)) / 2
    half = y_range.min_span / 2
    bounds = [*values, middle - half, middle + half, *y_range.include, *references]
    if y_range.floor is not None:
        bounds.append(y_range.floor)
    low, high = min(bounds), max(bounds)
    span = high - low or abs(low) / 10 or 1.0  # one value, all equal: room, not zero height
    top = high + y_range.pad * span
    if y_range.floor is not None and min(values) >= y_range.floor:
        return y_range.floor, top
    return low - y_range.pad * span, top


def line_chart(
    chart_id: str,
    title: str,
    x: Sequence[str] | Sequence[float],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    references: Sequence[ReferenceLine] = (),
    y_range: YRange = YRange(),
    x_scale: Scale = "linear",
    y_scale: Scale = "linear",
    unit: str = "",
) -> str:
    """An inline ``<svg>`` line chart of ``series`` over ``x``.

    ``x`` of strings is categorical (evenly spaced, a thinned set of them as rotated tick
    labels); of numbers, a numeric axis (``x_scale="log"`` for growth curves). ``chart_id``
    prefixes every id in the SVG and must be unique in the page. Axis labels carry the
    units; ``unit`` is appended to values in the hover text. Raises ``ValueError`` when no
    series has a finite value."""
    categorical = all(isinstance(v, str) for v in x)
    positions = list(range(len(x))) if categorical else [float(v) for v in x]
    finite = [
        [(i, float(v)) for i, v in enumerate(s.values) if v is not None and math.isfinite(v)]
        for s in series
    ]
    values = [v for points in finite for _, v in points]
    if not values:
        raise ValueError(f"{title}: no series has a finite value to plot")
    tips: dict[str, tuple[str, str]] = {}  # point gid -> (series label, hover text)
    with matplotlib.rc_context({**_RC, "svg.hashsalt": chart_id}):
        fig = Figure(figsize=FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_xscale(x_scale)
        ax.set_yscale(y_scale)
        handles = []
        for k, (s, points) in enumerate(zip(series, finite, strict=True)):
            color = f"C{k}"
            line = [v if v is not None and math.isfinite(v) else math.nan for v in s.values]
            ax.plot(positions, line, color=color, linewidth=1.4)  # NaN leaves a gap
            for i, v in points:
                # one artist per point, so that the SVG has a group per point to title
                gid = f"s{k}-p{i}"
                ax.plot([positions[i]], [v], "o", color=color, markersize=4, gid=gid)
                at = x[i] if categorical else f"{x[i]:g}"
                tips[gid] = (s.label, f"{at} {s.label}: {v:.6g}{unit}")
            handles.append(Line2D([], [], color=color, marker="o", markersize=4, label=s.label))
        for ref in references:
            ax.axhline(ref.value, color="0.35", linestyle="--", linewidth=1)
            ax.annotate(
                ref.label,
                xy=(1, ref.value),
                xycoords=ax.get_yaxis_transform(),
                xytext=(-2, 2),
                textcoords="offset points",
                ha="right",
                va="bottom",
                fontsize=8,
                color="0.3",
            )
        if y_scale == "linear":
            ax.set_ylim(*y_limits(values, y_range, [r.value for r in references]))
        if categorical:
            labels = list(x)
            ax.set_xlim(-0.5, len(labels) - 0.5)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=MAX_CATEGORY_TICKS, integer=True))
            ax.xaxis.set_major_formatter(
                FuncFormatter(lambda v, _: str(labels[int(v)]) if 0 <= v < len(labels) else "")
            )
            ax.tick_params(axis="x", labelrotation=30)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        if len(series) > 1:
            ax.legend(handles=handles, fontsize=8, loc="best")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=_NO_METADATA)
    return _inline(buf.getvalue(), chart_id, title, tips)


def _inline(svg: str, chart_id: str, title: str, tips: dict[str, tuple[str, str]]) -> str:
    """matplotlib's SVG made fit to inline: no prolog, ids prefixed, points titled."""
    svg = svg[svg.index("<svg") :]
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(title)}" ', 1)
    # matplotlib numbers its groups figure_1, axes_1, ... in every chart: prefix them all
    svg = re.sub(r'\bid="', f'id="{chart_id}-', svg)
    svg = svg.replace('xlink:href="#', f'xlink:href="#{chart_id}-')
    svg = svg.replace("url(#", f"url(#{chart_id}-")
    for gid, (label, tip) in tips.items():
        svg = svg.replace(
            f'<g id="{chart_id}-{gid}">',
            f'<g id="{chart_id}-{gid}" class="point" data-series="{html.escape(label)}">'
            f"<title>{html.escape(tip)}</title>",
            1,
        )
    return svg


def chart_page(title: str, charts: Sequence[str], note: str = "") -> str:
    """One self-contained HTML page of ``charts`` (``line_chart`` output) under ``title``,
    with ``note`` (e.g. the machine) as a line of text: what the benchmarks write beside
    their output."""
    sections = "\n".join(f"<section>{chart}</section>" for chart in charts)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
section {{ display: inline-block; vertical-align: top; margin: 0 1em 1em 0; }}
section svg {{ max-width: 100%; height: auto; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(note)}</p>
{sections}
</body></html>
"""
