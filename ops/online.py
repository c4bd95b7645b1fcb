"""Online metrics: how each served version did on the traffic it answered.

Passes cut from the served log (``PipelineConfig.served_tasks``) keep, per row, the version
that scored it and the probability it gave each task, beside the labels joined to it. Per
pass (a window), version and task this module keeps the AUC buckets and sums of
``trainers.metrics``; summed over windows they give a version's AUC, logloss and COPC
exactly as the cluster's distributed metrics are summed over workers. ``compare`` judges a
version against a baseline on comparable traffic: only the windows where both answered
labelled events (a swap's window, or every window while a share of requests goes to the
predecessor, ``serving.holdout_share``, or to a candidate, ``serving.canary_share``).
``judge_online`` acts on it: the canary's promotion, the alarm's rollback.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from serving_export.delivery import promote, registry_for, withdraw, withdraw_candidate
from streamrec.config import SERVED_VERSION, PipelineConfig, label_column, served_p_column
from streamrec.contracts.registry import OnlineMetrics
from streamrec.passes import complete_passes, pass_dir, read_manifest
from trainers.metrics import PassMetrics, metrics_from_stats, stats_from_predictions
from trainers.models import AUC_BUCKETS


@dataclass(frozen=True)
class OnlineStats:
    """Summable statistics of one version's labelled events for one task."""

    pos: np.ndarray  # positives per score bucket
    neg: np.ndarray  # negatives per score bucket
    sums: dict[str, float]  # trainers.metrics.STAT_NAMES

    def __add__(self, other: OnlineStats) -> OnlineStats:
        sums = {k: self.sums[k] + other.sums[k] for k in self.sums}
        return OnlineStats(self.pos + other.pos, self.neg + other.neg, sums)

    @property
    def count(self) -> int:
        return round(self.sums["count"])

    def metrics(self) -> PassMetrics:
        return metrics_from_stats(self.pos, self.neg, self.sums)


# window (pass id) -> version -> task -> stats
WindowStats = dict[str, dict[str, dict[str, OnlineStats]]]


def window_stats(cfg: PipelineConfig, pass_id: str) -> dict[str, dict[str, OnlineStats]]:
    """Each served version's statistics per task over one pass's labelled rows (its
    matured rows, with labels written before their window closes; rows
    without a served version or score, e.g. not written by ``streamrec serve``, left out);
    empty for a pass not cut from the served log."""
    if not cfg.served_tasks:
        return {}
    directory = pass_dir(cfg.paths.data_root, pass_id)
    labels = {label.name: label_column(i, label.name) for i, label in enumerate(cfg.labels)}
    columns = [SERVED_VERSION, *labels.values(), *map(served_p_column, cfg.served_tasks)]
    out: dict[str, dict[str, OnlineStats]] = {}
    manifest = read_manifest(directory)
    # labels written before their window closes: each impression once, with its final labels
    fresh = bool(cfg.feature_schema.fresh_labels)
    for part in manifest.matured_parts if fresh else manifest.parts:
        path = directory / part.file
        if part.rows == 0 or SERVED_VERSION not in pq.read_schema(path).names:
            continue  # cut before the pipeline read the served log
        table = pq.read_table(path, columns=columns)
        versions = table[SERVED_VERSION]
        for version in pc.unique(versions).drop_null().to_pylist():
            mine = table.filter(pc.equal(versions, version))
            for task in cfg.served_tasks:
                scored = mine.filter(pc.is_valid(mine[served_p_column(task)]))
                if scored.num_rows == 0:
                    continue
                pos, neg, sums = stats_from_predictions(
                    scored[served_p_column(task)].to_numpy(),
                    scored[labels[task]].to_numpy(),
                    AUC_BUCKETS,
                )
                stats = OnlineStats(pos, neg, sums)
                tasks = out.setdefault(version, {})
                tasks[task] = tasks[task] + stats if task in tasks else stats
    return out


def recent_window_stats(cfg: PipelineConfig, windows: int) -> WindowStats:
    """``window_stats`` of the newest ``windows`` complete passes."""
    return {p: window_stats(cfg, p) for p in complete_passes(cfg.paths.data_root)[-windows:]}


@dataclass(frozen=True)
class VersionOnline:
    """One version's online metrics for one task, summed over the windows it answered."""

    version: str
    task: str
    windows: list[str]
    count: int
    auc: float
    logloss: float
    copc: float

    def to_dict(self) -> dict[str, object]:
        return _json(self)


def _json(record: VersionOnline | Comparison) -> dict[str, object]:
    """A record's fields as JSON values: a NaN figure (no events) is null."""
    return {
        k: (None if math.isnan(v) else round(v, 6)) if isinstance(v, float) else v
        for k, v in asdict(record).items()
    }


def by_version(stats: WindowStats, windows: Iterable[str] | None = None) -> list[VersionOnline]:
    """Every version's metrics per task over ``windows`` (default: all of ``stats``), oldest
    version first."""
    chosen = sorted(stats if windows is None else windows)
    summed: dict[tuple[str, str], tuple[OnlineStats, list[str]]] = {}
    for window in chosen:
        for version, tasks in stats.get(window, {}).items():
            for task, s in tasks.items():
                key = (version, task)
                if key in summed:
                    total, seen = summed[key]
                    summed[key] = (total + s, [*seen, window])
                else:
                    summed[key] = (s, [window])
    out = []
    for (version, task), (s, seen) in sorted(summed.items()):
        m = s.metrics()
        out.append(VersionOnline(version, task, seen, s.count, m.auc, m.logloss, m.copc))
    return out


def online_of(cfg: PipelineConfig) -> list[VersionOnline]:
    """Every version's online metrics over the newest ``online.windows`` passes."""
    return by_version(recent_window_stats(cfg, cfg.online.windows))


@dataclass(frozen=True)
class Comparison:
    """A version against a baseline (the serving version, or the predecessor) on the
    windows where both answered."""

    version: str
    baseline: str
    task: str
    windows: list[str] = field(default_factory=list)
    count: int = 0
    baseline_count: int = 0
    auc: float = math.nan
    baseline_auc: float = math.nan

    @property
    def drop(self) -> float:
        """How much lower the version's AUC is than the baseline's (NaN: unknown)."""
        return self.baseline_auc - self.auc

    def enough(self, min_events: int) -> bool:
        """Both sides answered at least ``min_events`` labelled events."""
        return min(self.count, self.baseline_count) >= min_events

    def to_dict(self) -> dict[str, object]:
        return _json(self)


def compare(stats: WindowStats, version: str, baseline: str, task: str) -> Comparison:
    """``version`` against ``baseline`` for ``task``, on the windows where both answered
    labelled events of it."""
    shared = sorted(
        w
        for w, versions in stats.items()
        if task in versions.get(version, {}) and task in versions.get(baseline, {})
    )
    if not shared:
        return Comparison(version, baseline, task)
    metrics = {m.version: m for m in by_version(stats, shared) if m.task == task}
    mine, theirs = metrics[version], metrics[baseline]
    return Comparison(
        version, baseline, task, shared, mine.count, theirs.count, mine.auc, theirs.auc
    )


@dataclass(frozen=True)
class OnlineCheck:
    """What ``judge_online`` saw and did."""

    versions: list[VersionOnline]
    # the candidate against the serving version, or the serving one against its predecessor
    comparison: Comparison | None
    withdrawn: str | None = None  # the version withdrawn, if one was
    promoted: str | None = None  # the candidate promoted, if one was
    reason: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "versions": [v.to_dict() for v in self.versions],
            "comparison": self.comparison.to_dict() if self.comparison else None,
            "withdrawn": self.withdrawn,
            "promoted": self.promoted,
            "reason": self.reason,
        }


def _worse(c: Comparison, max_auc_drop: float) -> str:
    return (
        f"online {c.task} AUC {c.auc:.4f} over {c.count} labelled events, below "
        f"{c.baseline}'s {c.baseline_auc:.4f} over {c.baseline_count} by more than "
        f"{max_auc_drop} (windows {c.windows[0]}..{c.windows[-1]})"
    )


def judge_online(cfg: PipelineConfig) -> OnlineCheck:
    """Every version's online metrics over the newest ``online.windows`` passes, recorded
    in the registry (``/metrics`` of the services shows them); then one judgement on the
    windows two versions shared, once each answered ``online.min_events`` labelled events
    there, ``online.max_auc_drop`` the bar:

    - a candidate (``serving.canary_share``) against the serving version: promoted, or
      withdrawn when its AUC is lower by more than the bar;
    - else, with ``online.rollback``, the serving version against its predecessor: when
      lower by more than the bar it is withdrawn and its predecessor serves again."""
    online = cfg.online
    stats = recent_window_stats(cfg, online.windows)
    versions = by_version(stats)
    registry = registry_for(cfg)
    for version in sorted({m.version for m in versions}):
        mine = [OnlineMetrics.from_wire(m.to_dict()) for m in versions if m.version == version]
        registry.record_online(version, mine)
    serving = registry.serving_version()
    if serving is None:
        return OnlineCheck(versions, None)
    task = online.task or cfg.labels[0].name
    if (candidate := registry.candidate()) is not None:
        c = compare(stats, candidate, serving, task)
        if not c.enough(online.min_events):
            return OnlineCheck(versions, c)
        if c.drop > online.max_auc_drop:
            reason = _worse(c, online.max_auc_drop)
            withdraw_candidate(cfg, candidate, reason)
            return OnlineCheck(versions, c, withdrawn=candidate, reason=reason)
        promote(cfg, candidate)
        return OnlineCheck(versions, c, promoted=candidate)
    predecessor = registry.predecessor(serving)
    if predecessor is None:
        return OnlineCheck(versions, None)
    c = compare(stats, serving, predecessor, task)
    if not (online.rollback and c.enough(online.min_events) and c.drop > online.max_auc_drop):
        return OnlineCheck(versions, c)
    reason = _worse(c, online.max_auc_drop)
    withdraw(cfg, serving, predecessor, reason)
    return OnlineCheck(versions, c, withdrawn=serving, reason=reason)
