"""The pipeline exporter's mapping from ``streamrec status`` rows to metrics: the newest
pass at each stage, each task's progressive and matured figures, nothing for a figure
not known yet (pure logic on hand-made rows; the integration test reads a real one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ops.exporter import config_metrics, pass_metrics
from ops.status import NOT_TRAINED_YET, STALE, PassRow
from streamrec.metric_families import Families


def _scrape(rows: list[PassRow]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = Families("p1")
    pass_metrics(families, rows, "click")

    class Fixed:
        def collect(self):
            return iter(families)

    registry = CollectorRegistry()
    registry.register(Fixed())
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (f"streamrec_{name}", tuple(sorted({"pipeline": "p1", **labels}.items())))


ROWS = [
    PassRow(
        pass_id="202601010000",
        window_end=600.0,
        complete=True,
        completed_at=606.0,
        rows=100,
        trained=True,
        auc=0.7,
        logloss=0.5,
        copc=1.1,
        tasks={"conversion": {"auc": 0.6, "copc": 0.9, "best_auc": None}},
        matured_auc=0.72,
        matured_logloss=0.48,
        matured_copc=1.0,
        matured_tasks={"conversion": {"auc": 0.65, "copc": 0.95}},
        judged_in="202601010020",
        gate="reject",
        delivered="202601010000",
        freshness_seconds=9.5,
        table_keys=5000,
    ),
    PassRow(
        pass_id="202601010010",
        window_end=1200.0,
        complete=True,
        completed_at=1207.5,
        rows=120,
        dead_letters=3,
        trained=True,
        auc=0.75,
        logloss=0.45,
        copc=None,
        latency_seconds=0.2,
        train_seconds=1.5,
        gate="pass",
    ),
    PassRow(
        pass_id="202601010020",
        window_end=1800.0,
        complete=True,
        completed_at=1806.0,
        rows=90,
        flag=NOT_TRAINED_YET,
    ),
    PassRow(pass_id="202601010030", window_end=2400.0, complete=False),
]


def test_each_stage_shows_its_newest_pass_and_its_figures() -> None:
    got = _scrape(ROWS)
    assert got[_key("pass_window_end_timestamp_seconds", stage="complete")] == 1800.0
    assert got[_key("pass_window_end_timestamp_seconds", stage="trained")] == 1200.0
    assert got[_key("pass_window_end_timestamp_seconds", stage="delivered")] == 600.0
    assert got[_key("pass_complete_lag_seconds")] == 6.0
    assert got[_key("pass_rows")] == 90
    assert got[_key("pass_served_lag_seconds")] == 9.5
    assert got[_key("pass_train_seconds")] == 1.5
    assert got[_key("gate_passed")] == 1.0  # the newest judged pass passed
    assert got[_key("passes_untrained", state="waiting")] == 1
    assert got[_key("passes_untrained", state="stale")] == 0


def test_every_task_has_its_progressive_and_matured_figures() -> None:
    got = _scrape(ROWS)
    assert got[_key("pass_auc", task="click", labels="progressive")] == 0.75
    assert got[_key("pass_logloss", task="click", labels="progressive")] == 0.45
    assert got[_key("pass_auc", task="click", labels="matured")] == 0.72
    assert got[_key("pass_copc", task="conversion", labels="matured")] == 0.95
    # the newest trained pass has no conversion head figures and no COPC: none shown
    assert _key("pass_copc", task="click", labels="progressive") not in got
    assert _key("pass_auc", task="conversion", labels="progressive") not in got
    assert _key("pass_dead_letters") not in got  # the newest complete pass did not count any


def test_nothing_known_yet_is_no_series_not_a_zero() -> None:
    got = _scrape([PassRow(pass_id="202601010000", window_end=600.0, complete=False)])
    assert not any(name.startswith("streamrec_pass_window_end") for name, _ in got)
    assert got[_key("passes_untrained", state="stale")] == 0
    stale = [PassRow(pass_id="202601010000", window_end=600.0, complete=True, flag=STALE)]
    assert _scrape(stale)[_key("passes_untrained", state="stale")] == 1


def test_the_pass_window_the_alert_rules_count_in(shipped_config) -> None:
    families = Families("p1")
    config_metrics(families, shipped_config)
    (family,) = list(families)
    assert family.name == "streamrec_pass_window_seconds"
    assert family.samples[0].value == shipped_config.passes.clock.seconds
