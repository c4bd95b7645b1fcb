"""Status flags and the HTML report, on rows made here (no services)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html.parser import HTMLParser

from ops.report import plots, render
from ops.status import (
    PassRow,
    _rows_per_second,
    flag_held,
    flag_untrained,
    format_table,
    needs_attention,
    pass_finished,
    stale_after_seconds,
)
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.pass_status import PassStatus
from streamrec.contracts.training import TrainResult
from streamrec.passes import PartitionHold, PassClock
from trainers.metrics import PassMetrics


def _row(pass_id: str, **fields) -> PassRow:
    return PassRow(pass_id=pass_id, window_end=0.0, complete=True, **fields)


def _trained(pass_id: str, auc: float, **fields) -> PassRow:
    return _row(
        pass_id,
        trained=True,
        auc=auc,
        best_auc=0.83,
        logloss=0.5,
        copc=1.0,
        rows=1000,
        table_keys=100,
        **fields,
    )


def test_untrained_pass_is_flagged_stale_behind_a_trained_one_or_after_two_windows() -> None:
    rows = [
        _trained("202601010000", 0.7),
        _row("202601010001", completed_at=1000.0),  # skipped: a newer pass is trained
        _trained("202601010002", 0.75),
        _row("202601010003", completed_at=1000.0),  # the newest, waiting
    ]
    fresh = flag_untrained(rows, clock=PassClock(60), now=1010.0)
    assert [r.flag for r in fresh] == ["", "NOT TRAINED (stale)", "", "not trained yet"]
    late = flag_untrained(rows, clock=PassClock(60), now=1000.0 + 121)
    assert late[3].flag == "NOT TRAINED (stale)"
    assert needs_attention(fresh) and needs_attention(late)
    assert not needs_attention(flag_untrained(rows[:1], clock=PassClock(60), now=1010.0))


def test_table_shows_dashes_where_a_stage_has_not_reached_the_pass() -> None:
    table = format_table(
        flag_untrained([_trained("202601010000", 0.7), _row("202601010001")], PassClock(60), 0.0)
    )
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["pass", "rows", "late"]
    assert "0.7000" in lines[2] and lines[3].split()[1] == "-"
    assert lines[3].endswith("not trained yet")


def test_a_pass_is_finished_delivered_rejected_or_superseded_by_a_newer_version() -> None:
    p = "202601010010"
    gate = GateDecision(passed=True, auc=0.7, serving_auc=None)

    def status(**fields: object) -> PassStatus:
        return PassStatus.from_hash(
            p, {k: json.dumps(v) for k, v in fields.items()} | {"gate": gate.to_json()}
        )

    delivered = {"version": p, "previous": None, "switched": True, "at": 1.0}
    assert pass_finished(status(delivered=delivered), "202601010010")
    rejected_gate = gate.model_copy(update={"passed": False})
    assert pass_finished(PassStatus(pass_id=p, gate=rejected_gate), None)
    assert not pass_finished(status(), "202601010020")  # its own run still to deliver
    claimed = {"caught_up": {"by_run_of": "202601010000", "at": 1.0}}
    assert not pass_finished(status(**claimed), "202601010020")  # a catch-up trains it
    # the run's own pass, and a pass its catch-up trained, when the catch-up went on to
    # 0030: only 0030 is exported
    own = {"superseded": {"by": "202601010030", "delivers": True}}
    for older in (status(**own), status(**own, **claimed)):
        assert pass_finished(older, "202601010030") and pass_finished(older, "202601010040")
        assert not pass_finished(older, "202601010000")  # the run's export to come
    # the catch-up's newest pass was rejected: no pass of that run is delivered, ever
    rejected = status(superseded={"by": "202601010030", "delivers": False})
    assert pass_finished(rejected, "202601010000") and pass_finished(rejected, None)


TARGET = stale_after_seconds(PassClock(60))


class _Points(HTMLParser):
    """Per plot (``<svg>``): the ids of its points (``<g class="point">``) by series, and
    the texts it draws; every id in the page."""

    def __init__(self) -> None:
        super().__init__()
        self.per_plot: list[dict[str, list[str]]] = []
        self.texts: list[list[str]] = []
        self.ids: list[str] = []
        self._in_text = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "svg":
            self.per_plot.append({})
            self.texts.append([])
        elif tag == "g" and a.get("class") == "point":
            self.per_plot[-1].setdefault(a["data-series"], []).append(a["id"])
        self._in_text = tag == "text"

    def handle_data(self, data: str) -> None:
        if self._in_text:
            self.texts[-1].append(data)


def test_report_has_one_point_per_pass_in_each_plot() -> None:
    rows = [
        _trained(f"2026010100{i:02d}", 0.6 + i / 100, freshness_seconds=30.0 + i) for i in range(5)
    ]
    page = render("demo", rows, format_table(rows), TARGET)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert not re.search(r"(src|href)=\"https?:", page)  # self-contained
    parser = _Points()
    parser.feed(page)
    assert len(parser.ids) == len(set(parser.ids))  # several inline SVGs share one id space
    assert len(parser.per_plot) == len(plots(TARGET))
    for plot, points, texts in zip(plots(TARGET), parser.per_plot, parser.texts, strict=True):
        assert set(points) == {m.label for m in plot.metrics}, plot.title
        for ids in points.values():
            assert len(ids) == len(rows) and len(set(ids)) == len(rows), plot.title
        assert plot.y_label in texts and len({r.pass_id for r in rows} & set(texts)) > 2
    assert f"target: two windows ({TARGET:.0f} s)" in parser.texts[4]


def test_report_leaves_out_figures_a_pass_does_not_have() -> None:
    rows = [_trained("202601010000", 0.7), _row("202601010001")]
    parser = _Points()
    parser.feed(render("demo", rows, format_table(rows), TARGET))
    auc = parser.per_plot[0]
    assert len(auc["AUC"]) == 1 and len(auc["best reachable"]) == 1
    page = render("demo", rows, "", TARGET)
    assert "Freshness" in page and "no pass has this figure" in page


def test_an_incomplete_pass_held_by_an_open_transaction_is_flagged_with_where() -> None:
    hold = PartitionHold(
        topic="imp",
        partition=1,
        pass_id="202601010010",
        position=42,
        since=1767226200.0,  # 2026-01-01 00:10:00 UTC
    )
    rows = [_row("202601010000"), replace(_row("202601010010"), complete=False)]
    flagged = flag_held(rows, [hold])
    assert flagged[0].flag == ""
    assert flagged[1].flag == "held: a transaction open on imp/1 at offset 42 since 00:10:00Z"


def test_each_further_task_has_its_column_its_auc_plot_and_its_copc_line() -> None:
    tasks = {"conversion": {"auc": 0.81, "copc": 0.97, "best_auc": 0.85}}
    rows = [
        _trained(f"2026010100{i:02d}", 0.7, tasks=tasks, freshness_seconds=30.0) for i in range(3)
    ]  # and one trained before the second head: it has no figure for it
    rows.append(_trained("202601010003", 0.7, freshness_seconds=30.0))
    table = format_table(rows).splitlines()
    titles = table[0].split()
    assert titles[titles.index("best") + 1 : titles.index("best") + 3] == ["AUC", "conversion"]
    assert "0.8100" in table[2] and table[-1].split().count("-") >= 1
    parser = _Points()
    parser.feed(render("demo", rows, "\n".join(table), TARGET))
    drawn = plots(TARGET, ["conversion"])
    assert [p.title for p in drawn][:2] == [
        "Progressive AUC (before training on the pass)",
        "Progressive AUC of conversion",
    ]
    assert len(parser.per_plot) == len(drawn)
    conversion = parser.per_plot[1]
    assert len(conversion["AUC conversion"]) == 3 and len(conversion["best reachable"]) == 3
    copc = parser.per_plot[[p.key for p in drawn].index("copc")]
    assert len(copc["COPC"]) == 4 and len(copc["COPC conversion"]) == 3


def test_each_version_s_online_auc_is_drawn_against_its_progressive_auc() -> None:
    from ops.online import VersionOnline
    from ops.report import progressive_auc_of

    rows = [_trained(f"2026010100{i:02d}", 0.6 + i / 100) for i in range(4)]
    online = [
        VersionOnline("202601010000", "click", ["202601010002"], 900, 0.71, 0.4, 1.0),
        VersionOnline("202601010001", "click", ["202601010002"], 950, 0.55, 0.5, 1.2),
    ]
    # a version's progressive AUC: its model on the next trained pass, before training on it
    assert progressive_auc_of("202601010001", rows) == rows[2].auc
    assert progressive_auc_of("202601010003", rows) is None
    without = _Points()
    without.feed(render("demo", rows, format_table(rows), TARGET))  # no online metrics
    parser = _Points()
    parser.feed(render("demo", rows, format_table(rows), TARGET, online=online))
    assert len(parser.per_plot) == len(without.per_plot) + 1  # and no more
    points = parser.per_plot[-1]
    assert set(points) == {"online AUC, click", "progressive AUC"}
    assert len(points["online AUC, click"]) == 2 and len(points["progressive AUC"]) == 2
    assert "Online AUC" in "".join(parser.texts[-1])


def test_rows_a_second_count_the_steps_training_reads_too() -> None:
    m = PassMetrics(300, 0.7, 0.45, 1.0, 0.3, 0.4, 0.2, 0.2, 0.01)
    result = TrainResult(
        pass_id="202601010000",
        rows=300,
        count_matches_manifest=True,
        test=m,
        train=m,
        seconds={"train": 1.0},
        workers=2,
        reader="QueueDataset",
        progressive="sample",
        progressive_every=1,
        sync_mode="async",
        sync_rounds=None,
        dense_average=None,
        intercept=None,
        started_at=0.0,
        trained_at=1.0,
    )
    assert _rows_per_second(result) == 300
    stepped = result.model_copy(update={"rows_in_steps": 200, "seconds_in_steps": {"train": 2.0}})
    assert _rows_per_second(stepped) == 100  # 300 rows over the command's 1 s and the steps' 2
