"""Debian's Prometheus server scraping a live pipeline's parts as an operator runs them (a
live stream, ``streamrec build-passes --metrics-port``, ``streamrec cluster`` with its pass
follower, ``streamrec serve``, ``streamrec exporter``), with the shipped alert rules: what
its HTTP API serves equals ``streamrec status --json``; with the cluster stopped the
passes-not-trained alert fires once its ``for:`` has run, and resolves after the restart;
its graph of freshness per pass, opened in Chromium, shows the series."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from streamrec.config import PipelineConfig, dump_config
from streamrec.ports import free_port
from tests.integration.browser import open_graph
from tests.integration.cli_cluster import CLI, cli_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMETHEUS = "/usr/bin/prometheus"
PASS_SECONDS = 10
RATE = 200  # impressions a second: 2,000 rows a pass
NOT_TRAINED = "StreamrecPassesNotTrained"
SCRAPE_S = 1  # the test's scrape and rule-evaluation interval (the shipped file says 15 s)


def _rule(repo: Path, name: str) -> dict[str, Any]:
    groups = yaml.safe_load((repo / "deploy/prometheus/streamrec-alerts.yml").read_text())
    return next(r for g in groups["groups"] for r in g["rules"] if r.get("alert") == name)


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


@contextmanager
def _process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` as a child process until the block ends (SIGTERM, then SIGKILL)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _until(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 1.0) -> Any:
    """``check()``'s first truthy value, polled; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if value := check():
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(every_s)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


class Prometheus:
    """The server's HTTP API."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's samples: sorted labels (without job, instance) -> value."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        return {
            tuple(sorted((k, v) for k, v in s["metric"].items() if k not in ("job", "instance"))): (
                float(s["value"][1])
            )
            for s in r.json()["data"]["result"]
        }

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` with ``labels`` (and the pipeline), or None."""
        matches = [
            v
            for k, v in self.query(name).items()
            if all(dict(k).get(n) == x for n, x in labels.items())
        ]
        assert len(matches) <= 1, (name, labels, matches)
        return matches[0] if matches else None

    def alert(self, name: str) -> dict[str, Any] | None:
        r = httpx.get(f"{self.url}/api/v1/alerts", timeout=10)
        r.raise_for_status()
        return next(
            (a for a in r.json()["data"]["alerts"] if a["labels"]["alertname"] == name), None
        )

    def targets_up(self) -> bool:
        r = httpx.get(f"{self.url}/api/v1/targets", timeout=10)
        active = r.json()["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


def _listen(prefix: str, port: int) -> list[str]:
    """A command's listen flags: on loopback only."""
    return [f"--{prefix}host", "127.0.0.1", f"--{prefix}port", str(port)]


def _status(config: Path) -> dict[str, Any]:
    done = subprocess.run(
        [CLI, "status", "--config", str(config), "--json"], capture_output=True, timeout=120
    )
    assert done.returncode in (0, 5), done.stderr[-3000:]  # 5: a complete pass waits
    return json.loads(done.stdout)


def _newest(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return max((r for r in rows if r[key]), key=lambda r: r["pass_id"], default=None)


def _agrees(prom: Prometheus, status: dict[str, Any]) -> list[str]:
    """Where Prometheus's values differ from ``status``'s (empty: they agree)."""
    rows = status["passes"]
    complete, trained = _newest(rows, "complete"), _newest(rows, "trained")
    delivered = _newest(rows, "delivered")
    assert complete and trained and delivered, rows
    click = {"task": "click", "labels": "progressive"}
    expected = [
        ("pass_window_end_timestamp_seconds", {"stage": "complete"}, complete["window_end"]),
        ("pass_window_end_timestamp_seconds", {"stage": "trained"}, trained["window_end"]),
        ("pass_window_end_timestamp_seconds", {"stage": "delivered"}, delivered["window_end"]),
        ("pass_rows", {}, complete["rows"]),
        ("pass_auc", click, trained["auc"]),
        ("pass_logloss", click, trained["logloss"]),
        ("pass_copc", click, trained["copc"]),
        ("table_keys", {}, trained["table_keys"]),
        ("pass_train_rows_per_second", {}, trained["train_rows_per_second"]),
        ("checkpoint_save_seconds", {}, trained["save_seconds"]),
        ("cluster_restore_seconds", {}, status["cluster"]["restore"]["seconds"]),
        ("pass_served_lag_seconds", {}, delivered["freshness_seconds"]),
    ]
    wrong = []
    for name, labels, want in expected:
        got = prom.value(f"streamrec_{name}", **labels)
        if got is None or abs(got - want) > 1e-6 * max(1.0, abs(want)):
            wrong.append(f"{name}{labels}: Prometheus {got}, status {want}")
    return wrong


def test_prometheus_serves_what_status_shows_and_the_not_trained_alert_fires_and_resolves(
    repo: Path, make_config: Callable[..., PipelineConfig], tmp_path: Path
) -> None:
    cfg = make_config(
        join={"mode": "label_in_impression"},
        passes={
            "pass_seconds": PASS_SECONDS,
            "allowed_lateness_seconds": 2,
            "idle_partition_seconds": 2,
        },
        cluster={"follow_passes": True},
        # every pass is delivered: the freshness graph needs served passes, and the gate's
        # judgement of a 2,000-row pass is not what this test is about
        gate={"min_auc": 0.0},
    )
    config = dump_config(cfg, tmp_path / "pipeline.yaml")
    Path(cfg.paths.work_root).mkdir(parents=True, exist_ok=True)
    ports = {"builder": free_port(), "exporter": free_port(), "serve": free_port()}
    prom_port = free_port()
    scrape = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(repo / "deploy/prometheus/streamrec-alerts.yml")],
        "scrape_configs": [
            {"job_name": f"streamrec-{part}", "static_configs": [{"targets": [f"127.0.0.1:{p}"]}]}
            for part, p in ports.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(scrape))
    rule = _rule(repo, NOT_TRAINED)
    hold_s = _seconds(rule["for"])
    with (
        _process(
            [CLI, "produce", "--config", str(config), "--live", "--rate", str(RATE)],
            tmp_path / "produce.log",
        ),
        _process(
            [CLI, "build-passes", "--config", str(config), *_listen("metrics-", ports["builder"])],
            tmp_path / "builder.log",
        ),
        _process(
            [CLI, "exporter", "--config", str(config), *_listen("", ports["exporter"])],
            tmp_path / "exporter.log",
        ),
        _process(
            [CLI, "serve", "--config", str(config), "--port", str(ports["serve"])],
            tmp_path / "serve.log",
        ),
        _process(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            tmp_path / "prometheus.log",
        ),
    ):
        prom = Prometheus(prom_port)
        with cli_cluster(config):
            _until("Prometheus scraping every part", prom.targets_up, 120)
            _until(
                "three passes delivered",
                lambda: sum(bool(r["delivered"]) for r in _status(config)["passes"]) >= 3,
                240,
                2.0,
            )
            # a moment when no pass moved between two reads of status, with a scrape of
            # every part between them
            for _ in range(20):
                before = _status(config)
                time.sleep(2.5 * SCRAPE_S)
                wrong = _agrees(prom, before)
                if _status(config)["passes"] == before["passes"]:
                    break
            assert not wrong, wrong
            newest_complete = _newest(before["passes"], "complete")
            assert newest_complete is not None
            # a pass is complete only once every partition's watermark passed its end
            watermarks = prom.query("streamrec_builder_watermark_timestamp_seconds")
            assert len(watermarks) == cfg.kafka.partitions, watermarks
            assert min(watermarks.values()) >= newest_complete["window_end"]
            assert max(watermarks.values()) <= time.time()
            lag = prom.query("streamrec_builder_consumer_lag_records")
            read = prom.query("streamrec_builder_records_read_total")
            assert lag and read and sum(read.values()) >= newest_complete["rows"]
            assert prom.alert(NOT_TRAINED) is None  # trained passes: not even pending
            memory = prom.query("streamrec_cluster_resident_memory_bytes")
            assert {dict(k)["role"] for k in memory} == {"PSERVER", "TRAINER"}, memory
            assert all(v > 2**20 for v in memory.values()), memory
            newest_trained = _newest(_status(config)["passes"], "trained")
            assert newest_trained is not None
            last_trained = newest_trained["window_end"]
        stopped = time.time()
        firing = _until(
            f"{NOT_TRAINED} firing with the cluster stopped",
            lambda: (a := prom.alert(NOT_TRAINED)) and a["state"] == "firing" and a,
            3 * PASS_SECONDS + hold_s + 60,
        )
        fired = time.time()
        active_at = _rfc3339(firing["activeAt"])
        print(
            f"{NOT_TRAINED}: pending {active_at - stopped:.1f} s after the cluster stopped "
            f"({active_at - last_trained:.1f} s after the newest trained window's end), "
            f"firing {fired - active_at:.1f} s later (for: {rule['for']})"
        )
        # pending once three windows passed the newest trained one, firing after ``for:``
        assert active_at >= last_trained + 3 * PASS_SECONDS
        assert hold_s <= fired - active_at <= hold_s + 10 * SCRAPE_S
        restarting = time.time()
        with cli_cluster(config):
            _until(f"{NOT_TRAINED} resolved", lambda: prom.alert(NOT_TRAINED) is None, 180)
            resolved = time.time()
            print(f"{NOT_TRAINED} resolved {resolved - restarting:.1f} s after the restart began")
            restore = _status(config)["cluster"]["restore"]
            assert restore["checkpoint"] is not None and restore["saves"] >= 1, restore
            time.sleep(2.5 * SCRAPE_S)
            assert prom.value("streamrec_cluster_restore_seconds") == restore["seconds"]
        graph = open_graph(
            f"{prom.url}/graph?g0.expr=streamrec_pass_served_lag_seconds&g0.tab=0"
            "&g0.range_input=5m",
            tmp_path / "prometheus-freshness.png",
        )
        print("screenshot:", tmp_path / "prometheus-freshness.png")
        assert not [e for e in graph.errors if not _debian_popper(prom, e)], graph.errors
        assert any(
            "streamrec_pass_served_lag_seconds" in s and cfg.name in s for s in graph.series
        ), graph.series


def _debian_popper(prom: Prometheus, error: str) -> bool:
    """Whether ``error`` is the one Debian's package makes on every page of the classic UI:
    it links the ES-module build of popper.js as a classic script, whose ``export`` Chromium
    reports as a syntax error (Bootstrap's tooltips lose it; the graph does not)."""
    popper = httpx.get(f"{prom.url}/classic/static/popper.js/popper.min.js", timeout=10).text
    return error == "page error: Unexpected token 'export'" and "export{" in popper.replace(" ", "")


def _rfc3339(stamp: str) -> float:
    """Epoch seconds of an RFC 3339 time as Prometheus writes it (up to nanoseconds)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    return seconds + float(f"0.{fraction or 0}")
