"""deploy/grafana/streamrec.json, Grafana's JSON model of the pipeline's dashboard: every
series a panel asks for is one that ``streamrec exporter``, the pass builder or ``streamrec
serve`` serves
(a renamed metric would leave a panel empty without an error anywhere), and the panels are
laid out without overlapping."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ops.exporter import every_family
from serving_export.serving_metrics import ServingMetrics
from streaming.builder_metrics import builder_metrics, example_snapshot
from streamrec.config import PipelineConfig
from streamrec.metric_families import Families

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "streamrec.json"
SERIES = re.compile(r"\bstreamrec_[a-z_]+\b")


def _served(cfg: PipelineConfig) -> set[str]:
    """Every series name the exporter, the builder and the service write, histogram and
    counter suffixes included."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    builder = Families("example")
    builder_metrics(builder, example_snapshot())
    names = {f.name + s for f in [*every_family(cfg), *builder] for s in suffixes.get(f.type, [""])}
    for family in ServingMetrics().registry.collect():  # labelled ones have no sample yet
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def _unknown(exprs: list[str], served: set[str]) -> set[str]:
    return {name for expr in exprs for name in SERIES.findall(expr)} - served


def _exprs(dashboard: dict) -> list[str]:
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return queries + [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]


def test_every_panel_asks_for_a_served_series(shipped_config: PipelineConfig) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard)
    assert len(exprs) >= 10
    assert not _unknown(exprs, _served(shipped_config))


@pytest.mark.parametrize("typo", ["streamrec_pass_acu", "streamrec_serving_predict_second_bucket"])
def test_a_misspelt_series_is_caught(shipped_config: PipelineConfig, typo: str) -> None:
    assert _unknown([f"rate({typo}[5m])"], _served(shipped_config)) == {typo}


def test_the_panels_do_not_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    cells = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, panel["title"]
        assert g["x"] + g["w"] <= 24
        cells |= mine
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
