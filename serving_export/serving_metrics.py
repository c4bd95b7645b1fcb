"""The Prometheus metrics of ``streamrec serve``: its own counters and gauges, and three
collectors read when ``/metrics`` is scraped (the served log's counts, the answering
versions' online metrics, the serving version's gate evidence)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serving_export.served_log import ServedLog

if TYPE_CHECKING:  # the follower module imports this one
    from serving_export.follower import ServingState, VersionFollower

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


class ServingMetrics:
    """The service's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "streamrec_serving_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "streamrec_serving_predict_seconds",
            "Time to answer /predict.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.events = Counter("streamrec_serving_events", "Events scored.", registry=r)
        self.overloaded = Counter(
            "streamrec_serving_overloaded",
            "/predict requests refused with 503 because serving.max_in_flight were in flight.",
            registry=r,
        )
        self.in_flight = Gauge(
            "streamrec_serving_in_flight",
            "/predict requests admitted and not answered yet.",
            registry=r,
        )
        self.version = Gauge(
            "streamrec_serving_version", "1 for the version serving now.", ["version"], registry=r
        )
        self.version_age = Gauge(
            "streamrec_serving_version_age_seconds",
            "Now minus the event-time end of the serving version's pass (its freshness).",
            registry=r,
        )
        self.swaps = Counter("streamrec_serving_swaps", "Versions swapped in.", registry=r)
        self.load_failures = Counter(
            "streamrec_serving_load_failures", "Versions that failed to load.", registry=r
        )
        self.load_seconds = Gauge(
            "streamrec_serving_load_seconds", "Time the last swap took to build.", registry=r
        )


class LogCollector(Collector):
    """The served log's counts, read when /metrics is scraped."""

    def __init__(self, served_log: ServedLog) -> None:
        self._log = served_log

    def collect(self) -> Iterator[Metric]:
        counts = self._log.counts()
        yield CounterMetricFamily(
            "streamrec_serving_logged", "Served events logged to Kafka.", value=counts.logged
        )
        yield CounterMetricFamily(
            "streamrec_serving_unlogged",
            "Served events not logged: no room while Kafka was slow or away, or refused.",
            value=counts.unlogged,
        )
        yield GaugeMetricFamily(
            "streamrec_serving_log_backlog", "Served events waiting to be logged.", counts.backlog
        )


class OnlineCollector(Collector):
    """Each answering version's online metrics (AUC, logloss, COPC and the labelled events
    they are over, per task), as ``streamrec online`` last recorded them."""

    def __init__(self, follower: VersionFollower) -> None:
        self._follower = follower

    def collect(self) -> Iterator[Metric]:
        families = {
            name: GaugeMetricFamily(f"streamrec_online_{name}", help_, labels=["version", "task"])
            for name, help_ in (
                ("auc", "Online AUC of a version on the labelled events it answered."),
                ("logloss", "Online logloss of a version on the labelled events it answered."),
                ("copc", "Online clicks over predicted clicks of a version."),
                ("events", "Labelled events a version's online metrics are over."),
            )
        }
        for m in self._follower.online:
            labels = [m.version, m.task]
            families["events"].add_metric(labels, m.count)
            for name, value in (("auc", m.auc), ("logloss", m.logloss), ("copc", m.copc)):
                if value is not None:
                    families[name].add_metric(labels, value)
        yield from families.values()


class GateCollector(Collector):
    """The serving version's gate evidence per task: its progressive AUC, or with labels
    written before their window closed both the matured one (final labels) and the fresh
    one (the labels trained with), named by the ``labels`` label."""

    def __init__(self, state: ServingState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "streamrec_serving_gate_auc",
            "AUC the gate delivered the serving version on, per task; labels: matured (final "
            "labels, the newest matured pass) or fresh (labels trained with), else progressive.",
            labels=["version", "task", "labels"],
        )
        current = self._state.current
        gate = current.manifest.metrics.gate if current is not None else None
        if current is not None and gate is not None:
            main = current.manifest.feature_schema.labels[0].name
            fresh = gate.fresh_auc is not None
            kind = "matured" if fresh else "progressive"
            for task, auc in {main: gate.auc, **gate.task_aucs}.items():
                if math.isfinite(auc):
                    family.add_metric([current.version, task, kind], auc)
            if fresh:
                assert gate.fresh_auc is not None
                for task, auc in {main: gate.fresh_auc, **gate.fresh_task_aucs}.items():
                    family.add_metric([current.version, task, "fresh"], auc)
        yield family
