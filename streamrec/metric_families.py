"""The metric families of one Prometheus scrape, built by a custom collector.

Every streamrec process that serves ``/metrics`` from state it already holds (the exporter
from the pipeline's Redis and manifests, the pass builder from its partitions) builds its
families here at scrape time: each family is created on first use with the pipeline's name
as ``pipeline`` and its own labels, and a value not known yet is no sample at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class Families:
    """The metric families of one scrape, each created on first use with ``pipeline``
    and its own labels."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def set(self, name: str, about: str, value: float | None, **labels: str) -> None:
        """Set ``streamrec_<name>`` (a gauge) for ``labels``; nothing when ``value`` is None."""
        if value is not None:
            self._add(GaugeMetricFamily, name, about, value, labels)

    def count(self, name: str, about: str, value: float, **labels: str) -> None:
        """Set the counter ``streamrec_<name>_total`` for ``labels`` (``name`` without the
        suffix: prometheus-client appends it)."""
        self._add(CounterMetricFamily, name, about, value, labels)

    def _add(
        self,
        kind: type[GaugeMetricFamily | CounterMetricFamily],
        name: str,
        about: str,
        value: float,
        labels: dict[str, str],
    ) -> None:
        family = self._families.get(name)
        if family is None:
            family = kind(f"streamrec_{name}", about, labels=["pipeline", *sorted(labels)])
            self._families[name] = family
        family.add_metric([self.pipeline, *(labels[k] for k in sorted(labels))], value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())
