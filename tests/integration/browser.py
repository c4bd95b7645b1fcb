"""Pages opened in a real headless browser, as an operator opens them.

The browser is Debian's ``chromium`` (``scripts/setup.sh --test`` installs it with apt),
driven by Playwright's Python package launched on that binary: ``playwright install`` is
never run, since no browser build can be downloaded here. Playwright rather than Selenium
with ``chromium-driver``: uncaught page errors and console messages arrive as events on the
page (Selenium needs WebDriver BiDi or Chromium's own log endpoint for them), and it needs
one Debian package, not a browser and a driver whose versions must match.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page as PlaywrightPage

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_TIMEOUT_MS = 60_000

# For each inline SVG chart, what the browser drew: matplotlib groups each axis as
# "<chart>-matplotlib.axis_N" holding its ticks ("xtick_"/"ytick_" groups) and its label.
_READ_CHART = """svg => {
  const drawn = t => { const b = t.getBBox(); return b.width > 0 && b.height > 0; };
  const texts = sel => [...svg.querySelectorAll(sel)].filter(drawn).map(t => t.textContent);
  const axis = n => `g[id$="-matplotlib.axis_${n}"]`;
  const box = svg.getBoundingClientRect();
  return {
    label: svg.getAttribute("aria-label"),
    x_ticks: texts(`${axis(1)} > g[id*="-xtick_"] text`),
    y_ticks: texts(`${axis(2)} > g[id*="-ytick_"] text`),
    x_label: texts(`${axis(1)} > g[id*="-text_"] text`),
    y_label: texts(`${axis(2)} > g[id*="-text_"] text`),
    texts: texts("text"),
    points: svg.querySelectorAll("g.point").length,
    titled: svg.querySelectorAll("g.point > title").length,
    width: box.width,
    height: box.height,
  };
}"""


@dataclass(frozen=True)
class Chart:
    """One ``<svg role="img">`` as drawn: its label, axes' drawn texts, points, size."""

    label: str
    x_ticks: list[str]
    y_ticks: list[str]
    x_label: list[str]
    y_label: list[str]
    texts: list[str]
    points: int
    titled: int
    width: float
    height: float


@dataclass(frozen=True)
class Page:
    """What the browser showed: the charts in page order, and every error it reported
    (uncaught exceptions, console errors, failed requests)."""

    charts: list[Chart]
    errors: list[str]


@contextmanager
def _page(errors: list[str]) -> Iterator[PlaywrightPage]:
    """A page of headless Chromium; what it reports as an error goes to ``errors``."""
    from playwright.sync_api import ConsoleMessage, sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: bash scripts/setup.sh --test installs it (apt)")
    with sync_playwright() as p:
        # chromium_sandbox=False passes --no-sandbox: the tests run as root in CI, where
        # Chromium's sandbox refuses to start
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), chromium_sandbox=False, timeout=LAUNCH_TIMEOUT_MS
        )
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})

            def console(message: ConsoleMessage) -> None:
                if message.type == "error":
                    errors.append(f"console: {message.text}")

            page.on("console", console)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            yield page
        finally:
            browser.close()


def open_page(path: Path, screenshot: Path | None = None) -> Page:
    """Open the local HTML file ``path`` in headless Chromium and read its charts; save a
    full-page PNG to ``screenshot`` if given."""
    errors: list[str] = []
    with _page(errors) as page:
        page.goto(path.resolve().as_uri(), wait_until="load")
        charts = [
            Chart(**svg.evaluate(_READ_CHART))
            for svg in page.locator("svg[role=img]").element_handles()
        ]
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    return Page(charts=charts, errors=errors)


# every visible table row's cells, as the reader sees their text
_READ_ROWS = """() => [...document.querySelectorAll("article table tr")]
  .filter(tr => tr.getBoundingClientRect().height > 0)
  .map(tr => [...tr.cells].map(td => td.innerText.trim()))"""


@dataclass(frozen=True)
class Document:
    """A page of a site as drawn: its title, its tables' visible rows, the errors."""

    title: str
    rows: list[list[str]]
    errors: list[str]


def open_document(url: str, screenshot: Path | None = None) -> Document:
    """Open ``url`` in headless Chromium, read its title and table rows; save a full-page
    PNG to ``screenshot`` if given."""
    errors: list[str] = []
    with _page(errors) as page:
        response = page.goto(url, wait_until="networkidle")
        if response is None or not response.ok:
            errors.append(f"{url}: {response.status if response else 'no response'}")
        title = page.title()
        rows = page.evaluate(_READ_ROWS)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    return Document(title=title, rows=rows, errors=errors)


@dataclass(frozen=True)
class Graph:
    """Prometheus's classic graph page as drawn: its legend's series, the errors."""

    series: list[str]
    errors: list[str]


def open_graph(url: str, screenshot: Path | None = None) -> Graph:
    """Open a graph of Prometheus's own web UI at ``url`` in headless Chromium, wait for the
    graph to be drawn, read its legend's series; save a full-page PNG to ``screenshot``."""
    errors: list[str] = []
    with _page(errors) as page:
        response = page.goto(url, wait_until="networkidle")
        if response is None or not response.ok:
            errors.append(f"{url}: {response.status if response else 'no response'}")
        labels = page.locator(".legend .label")
        labels.first.wait_for(timeout=30_000)
        series = labels.all_inner_texts()
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    return Graph(series=series, errors=errors)
