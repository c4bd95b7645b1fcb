"""A synthetic impression stream drawn from a known logistic model.

    logit = bias + sum_slots w_slot[value] + sum_dense v_d * x_d      (multi slots: mean)
            [+ weight if a history item is in the target's cluster]        (interest)
    click ~ Bernoulli(sigmoid(logit))
    [conversion | click ~ Bernoulli(sigmoid(bias' + sum_slots w'_slot[value]))]  (conversion)

Value ids follow a Zipf law (a heavy head and a long tail), as real ids do. Because the
generating probabilities are known, the best AUC any model can reach on a batch is the AUC
of those probabilities, returned next to the events. A clicked impression also gets a click
``click_delay_seconds`` (exponential) after it, for the click-join mode; ``drift`` redraws
part of the weights, so a model trained before it must re-learn, and
``drift_half_life_minutes`` moves them all the time (``advance``), so a fresher model is a
better one. With ``interest``
(``streamrec.config.InterestConfig``) each event has a few interest clusters; its history
lists target values drawn mostly from them, its target value is one of them a ``focus``
share of the time, and the click gains ``weight`` when any history item shares the
target's cluster: a network that matches the target against each item can see that, one
that averages the history first sees it blurred by the history's length and mix. With
``conversion`` (``streamrec.config.ConversionConfig``) a clicked impression converts with a
known probability of its own, a log-normal delay after its click (most within minutes, a
tail of hours), so each task (click; conversion on all impressions; conversion of the
clicked) has a best reachable AUC too.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.atomic_fs import write_text_atomic
from streamrec.auc import exact_auc
from streamrec.config import LabelSpec, SchemaConfig, SyntheticConfig
from streamrec.errors import ConfigError

DEFAULT_CARDINALITY = 1000
MAX_MULTI_VALUES = 3


LABELS_MADE = ("click", "conversion")  # the label names this stream can make


@dataclass(frozen=True)
class SyntheticBatch:
    """Events of one time range with the generating probabilities of each."""

    events: list[dict[str, Any]]  # impressions, with each label of the schema as it happened
    probabilities: np.ndarray  # p(click)
    labels: np.ndarray  # clicked at all
    click_times: np.ndarray  # epoch ms of the click, -1 when not clicked
    conversion_probabilities: np.ndarray  # p(conversion | click); 0 without the process
    conversion_times: np.ndarray  # epoch ms of the conversion, -1 when none

    def times_of(self, name: str) -> np.ndarray:
        """When each impression's ``name`` event (click, conversion) happened; -1: never."""
        return self.click_times if name == "click" else self.conversion_times

    def label_events(self, name: str) -> list[dict[str, Any]]:
        """The ``name`` events (click, conversion) on their own topic, as a producer logs
        them: ``{"event_id", "<name>_time"}``."""
        return [
            {"event_id": e["event_id"], f"{name}_time": int(t)}
            for e, t in zip(self.events, self.times_of(name), strict=True)
            if t >= 0
        ]

    def labels_within(self, window_ms: int, name: str = "click") -> np.ndarray:
        """The ``name`` label as a join with ``window_ms`` sees it (late events are 0)."""
        times = np.array([e["event_time"] for e in self.events])
        happened = self.times_of(name)
        return ((happened >= 0) & (happened - times <= window_ms)).astype(np.int8)

    def best_task_aucs(self, labels: Sequence[LabelSpec]) -> dict[str, float]:
        """The best reachable AUC of each further task (a conversion label: on every
        impression, and ``conversion|click`` on the clicked rows when it requires the
        click), from the generating probabilities and the labels the builder writes."""
        expected = self.expected_labels(labels)
        best = {}
        for label in labels[1:]:
            if label.name != "conversion":
                continue
            joint = self.probabilities * self.conversion_probabilities
            best[label.name] = exact_auc(joint, expected[label.name])
            if label.requires == "click" and "click" in expected:
                rows = expected["click"] == 1
                conditional = self.conversion_probabilities[rows]
                best[f"{label.name}|click"] = exact_auc(conditional, expected[label.name][rows])
        return best

    def expected_labels(self, labels: Sequence[LabelSpec]) -> dict[str, np.ndarray]:
        """Each label (by name) as the pass builder writes it: within its window when
        joined, and a positive without the label it requires dropped unless kept."""
        out: dict[str, np.ndarray] = {}
        for label in labels:
            if label.source == "topic":
                out[label.name] = self.labels_within((label.window_seconds or 0) * 1000, label.name)
            else:
                out[label.name] = (self.times_of(label.name) >= 0).astype(np.int8)
        for label in labels:
            if label.requires is not None and label.unattributed == "dead_letter":
                out[label.name] = out[label.name] & out[label.requires]
        return out


class SyntheticStream:
    """Generates events from a fixed, seeded logistic model."""

    def __init__(self, schema: SchemaConfig, cfg: SyntheticConfig, id_prefix: str = "imp") -> None:
        self._schema = schema
        self._id_prefix = id_prefix
        self._cfg = cfg
        model_rng = np.random.default_rng(cfg.seed)
        self._card = {
            s.name: cfg.cardinality.get(s.name, DEFAULT_CARDINALITY) for s in schema.sparse
        }
        self._weights = {
            name: model_rng.normal(0.0, cfg.weight_scale, card) for name, card in self._card.items()
        }
        self._dense_weights = model_rng.normal(0.0, 0.5, len(schema.dense))
        if unknown := sorted({label.name for label in schema.labels} - set(LABELS_MADE)):
            raise ConfigError(
                f"schema.labels: the synthetic stream makes only {list(LABELS_MADE)} "
                f"labels, not {unknown}"
            )
        conversion = cfg.conversion
        if conversion is None and any(label.name == "conversion" for label in schema.labels):
            raise ConfigError(
                "schema.labels names conversion but synthetic.conversion is not set: the "
                "synthetic stream needs its conversion process (synthetic.conversion: {})"
            )
        # drawn after the click model, so adding a conversion process leaves clicks as they were
        self._conversion_weights = {
            name: model_rng.normal(0.0, conversion.weight_scale, card)
            for name, card in self._card.items()
            if conversion is not None
        }
        self._model_rng = model_rng
        self._rng = np.random.default_rng(cfg.seed + 1)
        self._walk_rng = np.random.default_rng(cfg.seed + 3)  # drift_half_life_minutes
        self._clock_ms: int | None = None  # the event time the weights stand at
        self._emitted = 0

    def drift(self) -> None:
        """Redraw ``drift_fraction`` of every slot's weights and of the dense weights."""
        rng, share = self._model_rng, self._cfg.drift_fraction
        for weights in self._weights.values():
            redraw = rng.random(len(weights)) < share
            weights[redraw] = rng.normal(0.0, self._cfg.weight_scale, int(redraw.sum()))
        redraw = rng.random(len(self._dense_weights)) < share
        self._dense_weights[redraw] = rng.normal(0.0, 0.5, int(redraw.sum()))

    def advance(self, to_ms: int) -> None:
        """Move every generating weight to event time ``to_ms`` (``drift_half_life_minutes``):
        each decays towards 0 by rho = 2^(-elapsed / half-life) and gains fresh noise of
        variance 1 - rho^2 times its own scale's, so its spread stays the same."""
        half_life = self._cfg.drift_half_life_minutes
        if half_life is None:
            return
        if self._clock_ms is None:
            self._clock_ms = to_ms
            return
        if to_ms <= self._clock_ms:
            return
        rho = 2.0 ** (-(to_ms - self._clock_ms) / (half_life * 60_000))
        self._clock_ms = to_ms
        rng, noise = self._walk_rng, np.sqrt(1 - rho * rho)
        conversion = self._cfg.conversion
        scaled = [(w, self._cfg.weight_scale) for w in self._weights.values()]
        scaled.append((self._dense_weights, 0.5))
        if conversion is not None:
            scaled += [(w, conversion.weight_scale) for w in self._conversion_weights.values()]
        for weights, scale in scaled:
            weights *= rho
            weights += rng.normal(0.0, scale * noise, len(weights))

    def _interest_logit(self, history: list[np.ndarray], target: np.ndarray) -> np.ndarray:
        """The interest term of each event: ``weight`` if any history item is in the
        target value's cluster."""
        interest = self._cfg.interest
        assert interest is not None
        k = interest.clusters
        hit = [bool(np.any(h % k == t % k)) for h, t in zip(history, target, strict=True)]
        return interest.weight * np.array(hit, dtype=np.float64)

    def probability(self, events: list[dict[str, Any]]) -> np.ndarray:
        """Click probability of ``events`` (made by this stream) under the current model."""
        logit = np.full(len(events), self._cfg.bias)
        interest = self._cfg.interest
        for slot in self._schema.sparse:
            if interest is not None and slot.name == interest.history:
                continue
            w = self._weights[slot.name]
            for i, e in enumerate(events):
                value = e["sparse"][slot.name]
                ids = [int(v[1:]) for v in value] if slot.multi else [int(value[1:])]
                logit[i] += w[ids].mean()
        if interest is not None:
            history = [
                np.array([int(v[1:]) for v in e["sparse"][interest.history]]) for e in events
            ]
            target = np.array([int(e["sparse"][interest.target][1:]) for e in events])
            logit += self._interest_logit(history, target)
        dense = np.array([[e["dense"][d.name] for d in self._schema.dense] for e in events])
        if len(self._schema.dense):
            logit += dense @ self._dense_weights
        return 1.0 / (1.0 + np.exp(-logit))

    def _ids(self, slot: str, n: int) -> np.ndarray:
        # Zipf ranks shuffled onto ids, so popular ids are not simply the small ones.
        ranks = self._rng.zipf(self._cfg.zipf_a, n)
        return (ranks * 2654435761) % self._card[slot]

    def _interests(self, n: int) -> tuple[list[list[str]], np.ndarray]:
        """``n`` histories (target values, each its own length, a ``focus`` share from the
        event's interest clusters, the rest from any) and target ids (from one of those
        clusters a ``focus`` share of the time)."""
        interest = self._cfg.interest
        assert interest is not None
        rng, k = self._rng, interest.clusters
        per_cluster = max(self._card[interest.target] // k, 1)
        own = rng.integers(0, k, (n, interest.interests))
        lengths = rng.integers(1, interest.max_history + 1, n)
        rows = np.repeat(np.arange(n), lengths)

        def clusters(of_rows: np.ndarray) -> np.ndarray:
            mine = own[of_rows, rng.integers(0, interest.interests, len(of_rows))]
            focused = rng.random(len(of_rows)) < interest.focus
            return np.where(focused, mine, rng.integers(0, k, len(of_rows)))

        ids = clusters(rows) + k * rng.integers(0, per_cluster, len(rows))
        targets = clusters(np.arange(n)) + k * rng.integers(0, per_cluster, n)
        prefix = interest.target[0]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        histories = [[f"{prefix}{i}" for i in ids[a:b]] for a, b in itertools.pairwise(bounds)]
        return histories, targets

    def batch(self, start_ms: int, end_ms: int, n: int) -> SyntheticBatch:
        """``n`` events with event times spread over ``[start_ms, end_ms)``, in time order
        (a drifting stream's weights as they stand at ``start_ms``)."""
        self.advance(start_ms)
        rng = self._rng
        times = np.sort(rng.integers(start_ms, end_ms, n))
        logit = np.full(n, self._cfg.bias)
        conversion = self._cfg.conversion
        conv_logit = np.full(n, conversion.bias if conversion else 0.0)
        columns: dict[str, list[Any]] = {}
        ids_of: dict[str, np.ndarray] = {}
        interest = self._cfg.interest
        histories, targets = self._interests(n) if interest is not None else ([], None)
        for slot in self._schema.sparse:
            w = self._weights[slot.name]
            if interest is not None and slot.name == interest.history:
                columns[slot.name] = histories
            elif slot.multi:
                counts = rng.integers(1, MAX_MULTI_VALUES + 1, n)
                flat = self._ids(slot.name, int(counts.sum()))
                bounds = np.concatenate([[0], np.cumsum(counts)])
                logit += np.add.reduceat(w[flat], bounds[:-1]) / counts
                if conversion is not None:
                    cw = self._conversion_weights[slot.name]
                    conv_logit += np.add.reduceat(cw[flat], bounds[:-1]) / counts
                prefix = slot.name[0]
                columns[slot.name] = [
                    [f"{prefix}{i}" for i in flat[a:b]] for a, b in itertools.pairwise(bounds)
                ]
            else:
                is_target = interest is not None and slot.name == interest.target
                ids = targets if is_target and targets is not None else self._ids(slot.name, n)
                logit += w[ids]
                if conversion is not None:
                    conv_logit += self._conversion_weights[slot.name][ids]
                ids_of[slot.name] = ids
                columns[slot.name] = [f"{slot.name[0]}{i}" for i in ids]
        if interest is not None:
            history = [np.array([int(v[1:]) for v in h]) for h in columns[interest.history]]
            logit += self._interest_logit(history, ids_of[interest.target])
        dense = rng.normal(0.0, 1.0, (n, len(self._schema.dense)))
        logit += dense @ self._dense_weights
        probs = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < probs).astype(np.int8)
        delays = rng.exponential(self._cfg.click_delay_seconds * 1000, n).astype(np.int64)
        click_times = np.where(labels == 1, times + delays, -1)
        conv_probs, conv_times = np.zeros(n), np.full(n, -1, dtype=np.int64)
        if conversion is not None:
            conv_probs = 1.0 / (1.0 + np.exp(-conv_logit))
            converted = (labels == 1) & (rng.random(n) < conv_probs)
            delay_ms = 1000 * conversion.delay_median_seconds
            lags = (delay_ms * rng.lognormal(0.0, conversion.delay_sigma, n)).astype(np.int64)
            conv_times = np.where(converted, click_times + lags, -1)
        happened = {"click": labels, "conversion": (conv_times >= 0).astype(np.int8)}
        label_fields = [
            (label.event_fields[0], happened[label.name]) for label in self._schema.labels
        ]
        events = [
            {
                "event_id": f"{self._id_prefix}-{self._cfg.seed}-{self._emitted + i}",
                "event_time": int(times[i]),
                "sparse": {s.name: columns[s.name][i] for s in self._schema.sparse},
                "dense": {
                    d.name: round(float(dense[i, j]), 5) for j, d in enumerate(self._schema.dense)
                },
                **{column: int(values[i]) for column, values in label_fields},
            }
            for i in range(n)
        ]
        self._emitted += n
        return SyntheticBatch(events, probs, labels, click_times, conv_probs, conv_times)


def best_auc_path(data_root: Path, tasks: bool = False) -> Path:
    """Where synthetic producers record each pass's best reachable AUC (for reports): the
    main task's, or (``tasks``) each further task's."""
    name = "best_task_auc.json" if tasks else "best_auc.json"
    return Path(data_root) / "synthetic" / name


def read_best_auc(data_root: Path) -> dict[str, float]:
    """Pass id -> best reachable AUC of the main task, where a producer recorded it."""
    path = best_auc_path(data_root)
    return json.loads(path.read_text()) if path.is_file() else {}


def read_best_task_auc(data_root: Path) -> dict[str, dict[str, float]]:
    """Pass id -> further task -> its best reachable AUC, where a producer recorded it."""
    path = best_auc_path(data_root, tasks=True)
    return json.loads(path.read_text()) if path.is_file() else {}


def record_best_auc(
    data_root: Path, best: dict[str, float], tasks: dict[str, dict[str, float]] | None = None
) -> None:
    """Merge ``best`` (pass id -> the main task's AUC) and ``tasks`` (pass id -> further
    task -> AUC) into the records; one producer writes at a time."""
    merged = {**read_best_auc(data_root), **best}
    write_text_atomic(best_auc_path(data_root), json.dumps(merged, sort_keys=True))
    if tasks:
        merged_tasks = {**read_best_task_auc(data_root), **tasks}
        write_text_atomic(
            best_auc_path(data_root, tasks=True), json.dumps(merged_tasks, sort_keys=True)
        )
