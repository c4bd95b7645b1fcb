"""One self-contained HTML page about recent passes: inline SVG plots, no scripts, no server.

Plots (matplotlib, through ``ops.charts``; one point per pass that has the figure, pass ids
as tick labels): progressive AUC on a 0.5-1 axis with chance marked, against the stream's
best reachable AUC where known (a multi-task model: one plot per further task too);
logloss and the counts (rows, table keys) from 0; COPC (every task's) around its calibrated
value 1, marked; freshness from 0 with its target, two windows (when
``streamrec status`` calls a waiting pass stale), marked. Then the status table. Each
point carries a ``<title>`` with the pass and the value, shown on hover.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ops.charts import ReferenceLine, Series, YRange, line_chart
from ops.online import VersionOnline
from ops.status import PassRow, task_names

FROM_ZERO = YRange(floor=0.0)
X_LABEL = "pass (window start, UTC)"


@dataclass(frozen=True)
class Metric:
    """One line of a plot: its legend label and how to read it from a pass's row."""

    label: str
    value: Callable[[PassRow], float | None]


@dataclass(frozen=True)
class Plot:
    """One chart of the page; ``key`` prefixes its ids, so it is unique in the page."""

    key: str
    title: str
    y_label: str
    metrics: tuple[Metric, ...]
    y_range: YRange
    references: tuple[ReferenceLine, ...] = ()
    unit: str = ""


def _task(name: str, figure: str) -> Callable[[PassRow], float | None]:
    """Reads a further task's ``figure`` (auc, copc, best_auc) from a pass's row."""
    return lambda r: ((r.tasks or {}).get(name) or {}).get(figure)


def _matured_task(name: str, figure: str) -> Callable[[PassRow], float | None]:
    """Reads a further task's matured ``figure`` (auc, copc) from a pass's row."""
    return lambda r: ((r.matured_tasks or {}).get(name) or {}).get(figure)


def plots(
    freshness_target_seconds: float, tasks: Sequence[str] = (), matured: bool = False
) -> tuple[Plot, ...]:
    """The report's plots, in page order; freshness is drawn against its target; each of
    a multi-task model's further ``tasks`` gets its AUC plot and its COPC line. With
    ``matured`` (labels written before their window closed) the progressive figures are
    named fresh and drawn beside the matured ones, on the final labels."""
    chance = (ReferenceLine(0.5, "chance (0.5)"),)
    fresh = "fresh " if matured else ""

    def also(label: str, value: Callable[[PassRow], float | None]) -> tuple[Metric, ...]:
        return (Metric(label, value),) if matured else ()

    return (
        Plot(
            "auc",
            "Progressive AUC (before training on the pass)",
            "AUC",
            (
                Metric(f"{fresh}AUC", lambda r: r.auc),
                *also("matured AUC", lambda r: r.matured_auc),
                Metric("best reachable", lambda r: r.best_auc),
            ),
            YRange(include=(1.0,)),  # chance to perfect: a 0.01 wobble is no swing
            chance,
        ),
        *(
            Plot(
                f"auc-{i}",
                f"Progressive AUC of {name}",
                "AUC",
                (
                    Metric(f"{fresh}AUC {name}", _task(name, "auc")),
                    *also(f"matured AUC {name}", _matured_task(name, "auc")),
                    Metric("best reachable", _task(name, "best_auc")),
                ),
                YRange(include=(1.0,)),
                chance,
            )
            for i, name in enumerate(tasks)
        ),
        Plot(
            "logloss",
            "Logloss (before training on the pass)",
            "logloss (nats per row)",
            (Metric("logloss", lambda r: r.logloss),),
            FROM_ZERO,
        ),
        Plot(
            "copc",
            "COPC (clicks / predicted clicks)",
            "COPC",
            (
                Metric(f"{fresh}COPC", lambda r: r.copc),
                *(Metric(f"{fresh}COPC {name}", _task(name, "copc")) for name in tasks),
                *also("matured COPC", lambda r: r.matured_copc),
                *(
                    m
                    for name in tasks
                    for m in also(f"matured COPC {name}", _matured_task(name, "copc"))
                ),
            ),
            YRange(min_span=0.2),  # 0.98-1.02 stays near the line, not a swing
            (ReferenceLine(1.0, "calibrated (1)"),),
        ),
        Plot("rows", "Rows per pass", "rows", (Metric("rows", lambda r: r.rows),), FROM_ZERO),
        Plot(
            "freshness",
            "Freshness (serving time - window end)",
            "seconds",
            (Metric("freshness", lambda r: r.freshness_seconds),),
            FROM_ZERO,
            (
                ReferenceLine(
                    freshness_target_seconds,
                    f"target: two windows ({freshness_target_seconds:.0f} s)",
                ),
            ),
            " s",
        ),
        Plot(
            "keys",
            "Sparse table size",
            "keys",
            (Metric("keys", lambda r: r.table_keys),),
            FROM_ZERO,
        ),
    )


def _chart(plot: Plot, rows: list[PassRow]) -> str:
    series = [Series(m.label, [m.value(r) for r in rows]) for m in plot.metrics]
    if not any(v is not None and math.isfinite(v) for s in series for v in s.values):
        return (
            f'<p class="empty"><b>{html.escape(plot.title)}</b>: no pass has this figure yet.</p>'
        )
    return line_chart(
        plot.key,
        plot.title,
        [r.pass_id for r in rows],
        series,
        x_label=X_LABEL,
        y_label=plot.y_label,
        references=plot.references,
        y_range=plot.y_range,
        unit=plot.unit,
    )


def progressive_auc_of(version: str, rows: list[PassRow]) -> float | None:
    """A version's progressive AUC: its model's AUC on the first trained pass after its
    own, measured before training on that pass (the figure the gate judges)."""
    later = [r for r in rows if r.pass_id > version and r.auc is not None]
    return later[0].auc if later else None


def online_chart(online: Sequence[VersionOnline], rows: list[PassRow]) -> str:
    """Online AUC (each task's, on the labelled events a version answered) against
    progressive AUC, per version; '' when no version has online metrics."""
    versions = sorted({m.version for m in online})
    if not versions:
        return ""
    auc = {(m.version, m.task): m.auc for m in online}
    tasks = sorted({m.task for m in online})
    series = [Series(f"online AUC, {t}", [auc.get((v, t)) for v in versions]) for t in tasks]
    series.append(Series("progressive AUC", [progressive_auc_of(v, rows) for v in versions]))
    return line_chart(
        "online",
        "Online AUC (served traffic) against progressive AUC, per version",
        versions,
        series,
        x_label="version",
        y_label="AUC",
        references=(ReferenceLine(0.5, "chance (0.5)"),),
        y_range=YRange(include=(0.5,), min_span=0.1),
    )


def render(
    pipeline: str,
    rows: list[PassRow],
    table: str,
    freshness_target_seconds: float,
    generated: datetime | None = None,
    online: Sequence[VersionOnline] = (),
) -> str:
    """The report page for ``rows`` (oldest first) with ``table`` (the status table);
    freshness is drawn against ``freshness_target_seconds``; ``online``: each version's
    online metrics, drawn against its progressive AUC."""
    when = (generated or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S UTC")
    matured = any(r.judged_in is not None for r in rows)
    charts = [_chart(p, rows) for p in plots(freshness_target_seconds, task_names(rows), matured)]
    if chart := online_chart(online, rows):
        charts.append(chart)
    sections = "\n".join(f"<section>{chart}</section>" for chart in charts)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>streamrec {html.escape(pipeline)}: passes</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
section {{ display: inline-block; vertical-align: top; margin: 0 1em 1em 0; }}
section svg {{ max-width: 100%; height: auto; }}
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
