"""``streamrec exporter``: the pipeline's per-pass facts as Prometheus metrics.

What ``streamrec status --json`` shows, read the same way (``ops.status``) at each scrape
and served on ``/metrics`` by prometheus-client: the newest pass at each stage (complete,
trained, delivered), its lags after the window, its rows and dead letters, each task's
progressive and matured AUC, logloss and COPC, the table's keys, the gate's newest
decision, the passes left untrained, the serving version and its replicas, and the
cluster's nodes. These facts are written by several processes (the builders, the cluster's
workers, the pass follower or the DAG, the services) into the pipeline's Redis and pass
manifests; one reader of them gives one answer, the one ``streamrec status`` gives, holds no
state of its own (a restart loses nothing) and costs a scrape one read of the newest
``--limit`` passes. Every series carries the pipeline's name as ``pipeline``.

Each value is a gauge of the newest pass at its stage, not a series per pass: a label per
pass id would add a series a window, forever. A pass's history is ``streamrec status``'s
and the report's.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ops.status import (
    NOT_TRAINED_YET,
    STALE,
    PassRow,
    cluster_summary,
    recent_passes,
    serving_summary,
)
from streamrec.config import EMBEDDED, PipelineConfig, load_config
from streamrec.entry import STOPPED, run_command
from streamrec.errors import ConfigError
from streamrec.metric_families import Families

DEFAULT_PORT = 9464  # OpenTelemetry's Prometheus exporter's; free of Prometheus's own
STAGES = ("complete", "trained", "delivered")


def _newest(rows: Iterable[PassRow], reached: str) -> PassRow | None:
    return max((r for r in rows if _reached(r, reached)), key=lambda r: r.pass_id, default=None)


def _reached(row: PassRow, stage: str) -> bool:
    if stage == "complete":
        return row.complete
    if stage == "trained":
        return row.trained
    return row.delivered is not None


def pass_metrics(families: Families, rows: list[PassRow], main_task: str) -> None:
    """The newest pass at each stage, and its figures, into ``families``."""
    for stage in STAGES:
        newest = _newest(rows, stage)
        families.set(
            "pass_window_end_timestamp_seconds",
            "Event-time end (epoch seconds) of the newest pass that reached the stage.",
            newest.window_end if newest else None,
            stage=stage,
        )
    if (complete := _newest(rows, "complete")) is not None:
        lag = complete.completed_at - complete.window_end if complete.completed_at else None
        families.set(
            "pass_complete_lag_seconds",
            "Newest complete pass: seconds from its window's end to its manifest.",
            lag,
        )
        for name, about, value in (
            ("pass_rows", "Rows of the newest complete pass.", complete.rows),
            (
                "pass_late_events",
                "Late impressions the newest complete pass counted.",
                complete.late,
            ),
            (
                "pass_dead_letters",
                "Malformed events dead-lettered while the newest complete pass was cut.",
                complete.dead_letters,
            ),
            (
                "pass_waiting_rows",
                "Rows of later windows waiting when the newest complete pass was cut.",
                complete.waiting,
            ),
        ):
            families.set(name, about, value)
    if (trained := _newest(rows, "trained")) is not None:
        families.set(
            "pass_training_wait_seconds",
            "Newest trained pass: seconds from complete to its training's start.",
            trained.latency_seconds,
        )
        families.set(
            "pass_train_seconds",
            "Newest trained pass: seconds of its train command.",
            trained.train_seconds,
        )
        families.set(
            "pass_train_rows_per_second",
            "Newest trained pass: rows trained a second in its training read.",
            trained.train_rows_per_second,
        )
        families.set(
            "pass_rows_in_steps",
            "Newest trained pass: rows trained in steps while its window filled "
            "(passes.step_seconds), before the pass was complete.",
            trained.rows_in_steps,
        )
        families.set(
            "checkpoint_save_seconds",
            "Newest trained pass: seconds its checkpoint took to save and become durable.",
            trained.save_seconds,
        )
        families.set(
            "table_keys", "Sparse table keys after the newest trained pass.", trained.table_keys
        )
        _quality(families, trained, main_task, "progressive")
    matured = max((r for r in rows if r.judged_in), key=lambda r: r.pass_id, default=None)
    if matured is not None:
        _quality(families, matured, main_task, "matured")
    if (delivered := _newest(rows, "delivered")) is not None:
        families.set(
            "pass_served_lag_seconds",
            "Newest delivered pass: seconds from its window's end to its version serving.",
            delivered.freshness_seconds,
        )
    gated = max((r for r in rows if r.gate), key=lambda r: r.pass_id, default=None)
    if gated is not None:
        families.set(
            "gate_passed",
            "The gate's newest decision: 1 passed, 0 rejected.",
            1.0 if gated.gate == "pass" else 0.0,
        )
    for state, flag in (("stale", STALE), ("waiting", NOT_TRAINED_YET)):
        families.set(
            "passes_untrained",
            "Complete passes not trained among the newest read: stale (past two windows, or "
            "behind a newer trained pass) or waiting.",
            float(sum(r.flag == flag for r in rows)),
            state=state,
        )


def _quality(families: Families, row: PassRow, main_task: str, labels: str) -> None:
    """Each task's AUC, logloss and COPC of ``row``: progressive (before training, on the
    labels trained with) or matured (on the final labels)."""
    by_task: dict[str, dict[str, Any]]
    if labels == "progressive":
        main = {"auc": row.auc, "logloss": row.logloss, "copc": row.copc}
        by_task = {main_task: main, **(row.tasks or {})}
    else:
        main = {"auc": row.matured_auc, "logloss": row.matured_logloss, "copc": row.matured_copc}
        by_task = {main_task: main, **(row.matured_tasks or {})}
    for task, figures in by_task.items():
        for figure, named in (("auc", "AUC"), ("logloss", "logloss"), ("copc", "COPC")):
            families.set(
                f"pass_{figure}",
                f"{named} per task: progressive (the newest trained pass, before training on "
                "it) or matured (the newest pass judged on its final labels).",
                figures.get(figure),
                task=task,
                labels=labels,
            )


def serving_metrics(families: Families, summary: dict[str, Any], cfg: PipelineConfig) -> None:
    """The registry's serving version and the replicas that note themselves."""
    version = summary["version"]
    if version is not None:
        families.set(
            "serving_window_end_timestamp_seconds",
            "Event-time end (epoch seconds) of the serving version's pass.",
            cfg.passes.clock.window(version)[1] / 1000,
        )
    families.set(
        "serving_replicas",
        "streamrec serve replicas noted in the registry.",
        float(len(summary["replicas"])),
    )


def cluster_metrics(families: Families, summary: dict[str, Any]) -> None:
    """Each configured node's heartbeat, and the cluster's generation."""
    for node, beat in summary["nodes"].items():
        running = beat is not None and beat.get("state") == "running"
        families.set(
            "cluster_node_up",
            "1 if the node's agent heartbeats with its members running, else 0.",
            1.0 if running else 0.0,
            node=node,
        )
        memory: dict[str, float] = {}
        for member in beat["members"] if beat is not None else []:
            memory[member["role"]] = memory.get(member["role"], 0) + member.get("rss_bytes", 0)
        for role, rss in sorted(memory.items()):
            families.set(
                "cluster_resident_memory_bytes",
                "Resident memory of the node's members of a role (PSERVER: its servers, "
                "which hold their shares of the sparse table; TRAINER: its workers).",
                rss,
                node=node,
                role=role,
            )
    if (generation := summary["generation"]) is not None:
        families.set(
            "cluster_generation",
            "The cluster's generation (a restart is a new one).",
            float(generation["number"]),
        )
    if (restore := summary.get("restore")) is not None:
        families.set(
            "cluster_restore_seconds",
            "Seconds the newest generation's first worker took to load its checkpoint chain.",
            restore["seconds"],
        )


def config_metrics(families: Families, cfg: PipelineConfig) -> None:
    """The settings the alert rules measure against."""
    families.set(
        "pass_window_seconds",
        "Length of a pass's event-time window (passes.pass_seconds).",
        float(cfg.passes.clock.seconds),
    )


def scrape_metrics(families: Families, seconds: float) -> None:
    """What the scrape itself cost."""
    families.set(
        "exporter_scrape_seconds",
        "Seconds this scrape took to read the pipeline's status.",
        seconds,
    )


def every_family(cfg: PipelineConfig) -> Families:
    """Every series this exporter can serve, for a pipeline ``cfg`` where every stage has a
    figure (made-up values): what the metrics reference and the dashboard's test list."""
    families = Families("example")
    every = PassRow(
        pass_id="202601010000",
        window_end=600.0,
        complete=True,
        completed_at=606.0,
        rows=1,
        late=0,
        waiting=0,
        dead_letters=0,
        trained=True,
        auc=0.5,
        logloss=0.5,
        copc=1.0,
        tasks={"conversion": {"auc": 0.5, "copc": 1.0}},
        matured_auc=0.5,
        matured_logloss=0.5,
        matured_copc=1.0,
        judged_in="202601010020",
        latency_seconds=0.0,
        train_seconds=1.0,
        train_rows_per_second=1.0,
        rows_in_steps=1,
        save_seconds=1.0,
        table_keys=1,
        gate="pass",
        delivered="202601010000",
        freshness_seconds=1.0,
    )
    pass_metrics(families, [every], cfg.labels[0].name)
    serving_metrics(families, {"version": every.pass_id, "replicas": []}, cfg)
    beat = {"state": "running", "members": [{"role": "PSERVER", "pid": 1, "rss_bytes": 1}]}
    cluster = {"nodes": {"local": beat}, "generation": {"number": 1}, "restore": {"seconds": 1}}
    cluster_metrics(families, cluster)
    scrape_metrics(families, 0.0)
    config_metrics(families, cfg)
    return families


class PipelineCollector(Collector):
    """Reads the pipeline's status at each scrape."""

    def __init__(self, cfg: PipelineConfig, limit: int) -> None:
        self.cfg = cfg
        self.limit = limit

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        families = Families(self.cfg.name)
        main_task = self.cfg.labels[0].name
        config_metrics(families, self.cfg)
        pass_metrics(families, recent_passes(self.cfg, self.limit), main_task)
        serving_metrics(families, serving_summary(self.cfg), self.cfg)
        cluster_metrics(families, cluster_summary(self.cfg))
        scrape_metrics(families, time.perf_counter() - started)
        yield from families


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    parser = argparse.ArgumentParser(
        prog="streamrec exporter",
        description="Serve the pipeline's per-pass facts on /metrics for Prometheus, "
        "until Ctrl-C or SIGTERM.",
    )
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML (real Redis)")
    parser.add_argument("--host", default="0.0.0.0", help="listen address")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port")
    parser.add_argument("--limit", type=int, default=20, help="newest passes read a scrape")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``streamrec exporter``: serve until Ctrl-C or SIGTERM (exit 130)."""
    args = parser().parse_args(argv)
    stop = threading.Event()
    return run_command(lambda: _serve(args, stop), stop)


def _serve(args: argparse.Namespace, stop: threading.Event) -> int:
    cfg = load_config(args.config)
    if cfg.redis.url == EMBEDDED:
        raise ConfigError(f"{args.config}: redis.url is 'embedded': give the running Redis")
    registry = CollectorRegistry()
    collector = PipelineCollector(cfg, args.limit)
    list(collector.collect())  # an unreachable Redis is exit 3 now, not at the first scrape
    registry.register(collector)
    server, thread = start_http_server(args.port, args.host, registry)
    try:
        stop.wait()
    finally:
        server.shutdown()
        thread.join(timeout=5)
    return STOPPED
