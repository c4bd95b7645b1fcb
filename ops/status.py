"""The state of recent passes, from what the stages left behind: one row per pass.

Sources, each read where its owner writes it: pass manifests (rows, late and unmatched
clicks, dead letters, when the pass became complete), the per-pass status hash in Redis
(progressive metrics, train time, save kind, table keys, gate, delivery), the model
registry (what serves now), the synthetic producer's best reachable AUC, where known, and
the builders' notes of windows an open Kafka transaction holds back.

``freshness`` of a delivered pass is the time it became the serving model minus its window
end; ``latency`` is training start minus pass completion (the scheduling delay).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ops.online import VersionOnline, online_of
from ops.retention import leftovers
from serving_export.delivery import registry_for
from streaming.synthetic import read_best_auc, read_best_task_auc
from streamrec.atomic_fs import writer_gone
from streamrec.config import PipelineConfig
from streamrec.contracts.cluster import RestoreNote
from streamrec.contracts.pass_status import PassStatus, read_status, read_statuses
from streamrec.contracts.training import TrainResult
from streamrec.errors import ContractError
from streamrec.passes import (
    PartitionHold,
    PassClock,
    complete_passes,
    pass_dir,
    read_holds,
    read_manifest,
)
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys

log = logging.getLogger(__name__)

# a complete pass's flag while it is not trained: past its time, or still within it
STALE, NOT_TRAINED_YET = "NOT TRAINED (stale)", "not trained yet"


@dataclass(frozen=True)
class PassRow:
    """Everything known about one pass; None where a stage has not reached it."""

    pass_id: str
    window_end: float  # epoch seconds
    complete: bool
    completed_at: float | None = None
    rows: int | None = None
    late: int | None = None
    late_labels: int | None = None  # label events after their window, every label
    unmatched_labels: int | None = None  # ... whose impression was not pending
    waiting: int | None = None  # impressions of later windows waiting when it was cut
    labels: dict[str, dict[str, int]] | None = None  # label -> its counts (LabelCounts)
    # a multi-task model's further tasks (and conditional ones): task -> auc, copc, best_auc
    tasks: dict[str, dict[str, float | None]] | None = None
    dead_letters: int | None = None
    trained: bool = False
    auc: float | None = None
    best_auc: float | None = None
    logloss: float | None = None
    copc: float | None = None
    # labels written before their window closed: auc, logloss and copc are on the labels
    # trained with (fresh, biased); these on the final labels, once its impressions matured
    matured_auc: float | None = None
    matured_logloss: float | None = None
    matured_copc: float | None = None
    matured_tasks: dict[str, dict[str, float]] | None = None  # further tasks: auc, copc
    judged_in: str | None = None  # the pass whose training judged it on the final labels
    train_seconds: float | None = None
    train_rows_per_second: float | None = None  # rows over the training reads' seconds
    rows_in_steps: int | None = None  # trained in steps before the pass was complete
    save_seconds: float | None = None  # the checkpoint's save, until durable
    latency_seconds: float | None = None
    save_kind: str | None = None
    table_keys: int | None = None
    gate: str | None = None  # pass | reject
    delivered: str | None = None  # the version this pass delivered
    caught_up_by: str | None = None  # trained by the catch-up of this pass's run
    freshness_seconds: float | None = None
    flag: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _rows_per_second(train: TrainResult) -> float | None:
    """Rows trained a second over the training reads: the pass command's and its steps'."""
    seconds = train.seconds.get("train", 0.0) + train.seconds_in_steps.get("train", 0.0)
    return train.train.count / seconds if seconds else None


def _row(
    cfg: PipelineConfig,
    pass_id: str,
    status: PassStatus,
    best: dict[str, float],
    best_tasks: dict[str, dict[str, float]],
) -> PassRow:
    fields: dict[str, Any] = {}
    directory = pass_dir(cfg.paths.data_root, pass_id)
    try:
        manifest = read_manifest(directory)
    except ContractError:
        manifest = None
    if manifest is not None:
        c = manifest.counts
        fields |= {
            "completed_at": _epoch(manifest.created_at),
            "rows": manifest.rows,
            "late": c.late,
            "late_labels": c.label_total("late"),
            "unmatched_labels": c.label_total("unmatched"),
            "waiting": c.waiting,
            "labels": {name: counts.model_dump() for name, counts in c.labels.items()},
            "dead_letters": c.malformed_total,
        }
    if (train := status.train) is not None:
        fields["trained"] = True
        fields |= {
            "auc": train.test.auc,
            "logloss": train.test.logloss,
            "copc": train.test.copc,
            "train_seconds": sum(train.seconds.values()) or None,
            "train_rows_per_second": _rows_per_second(train),
            "rows_in_steps": train.rows_in_steps,
            "save_seconds": train.seconds.get("save"),
            "save_kind": train.checkpoint.kind if train.checkpoint else None,
            "table_keys": train.checkpoint.table_keys if train.checkpoint else None,
        }
        if train.tasks:
            known = best_tasks.get(pass_id, {})
            fields["tasks"] = {
                name: {"auc": t.test.auc, "copc": t.test.copc, "best_auc": known.get(name)}
                for name, t in train.tasks.items()
            }
        if "completed_at" in fields:
            fields["latency_seconds"] = train.started_at - fields["completed_at"]
    if (matured := status.matured) is not None:
        main, *others = matured.tasks
        first = matured.tasks[main]
        fields |= {
            "matured_auc": first.auc,
            "matured_logloss": first.logloss,
            "matured_copc": first.copc,
            "judged_in": matured.judged_in,
        }
        if others:
            fields["matured_tasks"] = {
                n: {"auc": matured.tasks[n].auc, "copc": matured.tasks[n].copc} for n in others
            }
    end = cfg.passes.clock.window(pass_id)[1] / 1000
    if (gate := status.gate) is not None:
        fields["gate"] = "pass" if gate.passed else "reject"
    if (delivered := status.delivered) is not None:
        fields["delivered"] = delivered.version
        fields["freshness_seconds"] = delivered.at - end
    if (caught := status.caught_up) is not None:
        fields["caught_up_by"] = caught.by_run_of
    return PassRow(
        pass_id=pass_id,
        window_end=end,
        complete=manifest is not None,
        best_auc=best.get(pass_id),
        **fields,
    )


def pass_finished(status: PassStatus, serving: str | None) -> bool:
    """Whether the pipeline is done with a pass, from its status and the serving version:
    delivered, rejected by the gate, or superseded by a newer pass of the same run's
    catch-up (``ops.catchup``) that serves (or a later one does) or that the gate
    rejected (then no pass of that run is delivered)."""
    if status.delivered is not None or (status.gate is not None and not status.gate.passed):
        return True
    superseded = status.superseded
    if superseded is None:
        return False
    return not superseded.delivers or (serving or "") >= superseded.by


def finished_status(cfg: PipelineConfig, pass_id: str) -> PassStatus | None:
    """The pass's status once the pipeline is done with it (``pass_finished``), else None."""
    status = read_status(connect(cfg.redis), RedisKeys(cfg.name), pass_id)
    return status if pass_finished(status, registry_for(cfg).serving_version()) else None


def recent_passes(cfg: PipelineConfig, limit: int = 20, now: float | None = None) -> list[PassRow]:
    """The newest ``limit`` passes known on disk or in Redis, oldest first; a complete pass
    that is not trained is flagged, and marked stale once it has waited two windows."""
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    holds = read_holds(cfg.paths.data_root)
    known = set(complete_passes(cfg.paths.data_root))
    known |= {keys.pass_of(k) for k in scan_keys(r, keys.pass_status("*"))}
    known |= {h.pass_id for h in holds if h.pass_id}
    ids = sorted(known)[-limit:]
    statuses = read_statuses(r, keys, ids, tolerant=True)
    best, best_tasks = read_best_auc(cfg.paths.data_root), read_best_task_auc(cfg.paths.data_root)
    rows = [_row(cfg, p, s, best, best_tasks) for p, s in zip(ids, statuses, strict=True)]
    rows = flag_held(rows, holds)
    return flag_untrained(rows, cfg.passes.clock, time.time() if now is None else now)


def flag_held(rows: list[PassRow], holds: list[PartitionHold]) -> list[PassRow]:
    """Flag each incomplete pass whose window a transaction left open holds back."""
    by_pass: dict[str, list[PartitionHold]] = {}
    for hold in holds:
        if hold.pass_id:
            by_pass.setdefault(hold.pass_id, []).append(hold)
    flagged = []
    for row in rows:
        if not row.complete and (held := by_pass.get(row.pass_id)):
            where = ", ".join(f"{h.topic}/{h.partition} at offset {h.position}" for h in held)
            since = datetime.fromtimestamp(min(h.since for h in held), UTC).strftime("%H:%M:%SZ")
            row = replace(row, flag=f"held: a transaction open on {where} since {since}")
        flagged.append(row)
    return flagged


def stale_after_seconds(clock: PassClock) -> float:
    """How long a complete pass may wait for training before it is stale: two windows. The
    report draws the same bound as the freshness target."""
    return 2 * clock.seconds


def flag_untrained(rows: list[PassRow], clock: PassClock, now: float) -> list[PassRow]:
    """Flag each complete pass that is not trained: ``stale`` once it has waited two windows
    or a newer pass is trained (it was skipped), else ``not trained yet``."""
    newest_trained = max((row.pass_id for row in rows if row.trained), default="")
    flagged = []
    for row in rows:
        if row.complete and not row.trained:
            waited = now - (row.completed_at or now)
            stale = row.pass_id < newest_trained or waited > stale_after_seconds(clock)
            row = replace(row, flag=STALE if stale else NOT_TRAINED_YET)
        flagged.append(row)
    return flagged


def needs_attention(rows: list[PassRow]) -> bool:
    """A complete pass left untrained past its time (or behind a newer trained pass)."""
    return any(row.flag == STALE for row in rows)


def serving_summary(
    cfg: PipelineConfig, now: float | None = None, online: list[VersionOnline] | None = None
) -> dict[str, Any]:
    """The serving version, how old its data is (now minus its window end), what each
    running ``streamrec serve`` replica serves, on which host; each version's online
    metrics (passes cut from the served log; ``online``: already read) and the versions
    withdrawn on them, with why."""
    registry = registry_for(cfg)
    version = registry.serving_version()
    summary: dict[str, Any] = {
        "version": version,
        "age_seconds": None,
        "replicas": [note.to_wire() for note in registry.replicas()],
        "online": [m.to_dict() for m in (online if online is not None else online_of(cfg))],
        "candidate": registry.candidate(),
        "withdrawn": {v: w.to_wire() for v, w in registry.withdrawn().items()},
    }
    if version is not None:
        now = time.time() if now is None else now
        summary["age_seconds"] = now - cfg.passes.clock.window(version)[1] / 1000
    return summary


def format_serving(summary: dict[str, Any]) -> str:
    """The serving summary as lines: the version, then each replica and its host."""
    age = summary["age_seconds"]
    lines = [
        f"serving: {summary['version'] or 'nothing yet'}"
        + (f" (data {age:.0f} s old)" if age is not None else "")
    ]
    for replica in summary["replicas"]:
        logged = ""
        if replica.get("logged") is not None:  # a replica with a served log says how it goes
            logged = f"; logged {replica['logged']}, could not log {replica['unlogged']}"
        held = f" ({replica['held']} answers the holdout share)" if replica.get("held") else ""
        if replica.get("canary"):
            held += f" (candidate {replica['canary']} answers the canary share)"
        lines.append(
            f"  {replica['replica']:<24} on {replica['host']:<12} serves "
            f"{replica['version'] or 'nothing yet'}{held}{logged}"
        )
    for m in summary.get("online", []):
        lines.append(
            f"  online {m['version']} {m['task']}: AUC {_figure(m['auc'])} logloss "
            f"{_figure(m['logloss'])} COPC {_figure(m['copc'])} over {m['count']} labelled "
            f"events in {len(m['windows'])} windows"
        )
    if summary.get("candidate"):
        lines.append(f"  candidate on canary: {summary['candidate']}")
    for version, note in sorted(summary.get("withdrawn", {}).items()):
        lines.append(f"  withdrawn {version}: {note['reason']}")
    return "\n".join(lines)


def _figure(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def leftover_summary(cfg: PipelineConfig, now: float | None = None) -> dict[str, Any]:
    """The writers' temporaries in the pipeline's folders, which every listing skips: how
    many, where, how old, and whether their writer is known to be gone (a crash's
    leftover, removed when that writer starts again or by retention after
    ``retention.leftover_minutes``) or may still be writing."""
    now = time.time() if now is None else now
    found = []
    for path in leftovers(cfg):
        try:
            age = now - path.lstat().st_mtime
        except FileNotFoundError:  # published or removed while we looked
            continue
        found.append(
            {"path": str(path), "age_seconds": round(age, 1), "writer_gone": writer_gone(path)}
        )
    return {
        "count": len(found),
        "grace_minutes": cfg.retention.leftover_minutes,
        "leftovers": found,
    }


def format_leftovers(summary: dict[str, Any]) -> str:
    """The leftover summary as lines for ``streamrec status``: one per folder holding any."""
    if not summary["count"]:
        return "leftovers: none"
    lines = [
        f"leftovers: {summary['count']} writer's temporaries, skipped by every listing "
        f"(removed when their writer starts again, or by retention after "
        f"{summary['grace_minutes']:g} min):"
    ]
    by_folder: dict[str, list[dict[str, Any]]] = {}
    for item in summary["leftovers"]:
        by_folder.setdefault(str(Path(item["path"]).parent), []).append(item)
    for folder, items in sorted(by_folder.items()):
        lines.append(f"  {folder}: {len(items)}")
        for item in items:
            state = "writer gone" if item["writer_gone"] else "writer may be running"
            name = Path(item["path"]).name
            lines.append(f"    {name} ({item['age_seconds']:.0f} s old, {state})")
    return "\n".join(lines)


def cluster_summary(cfg: PipelineConfig) -> dict[str, Any]:
    """The cluster as its node agents report it: the generation, each configured node
    (its state and members, or ``None`` if it is not heartbeating), the last restart, and
    what the newest generation restored."""
    from trainers.hosts.generation import GenerationStore
    from trainers.hosts.topology import LOCAL_NODE

    names = [n.name for n in cfg.cluster.nodes] or [LOCAL_NODE]
    r, keys = connect(cfg.redis), RedisKeys(cfg.name)
    store = GenerationStore(r, keys, names)
    generation = store.read()
    beats = store.beats()
    history = store.history(limit=2)
    restore = r.get(keys.cluster_restore)
    return {
        "generation": generation.to_wire() if generation else None,
        "nodes": {n: beats[n].to_wire() if n in beats else None for n in names},
        "last_restart": history[0].to_wire() if history and history[0].number > 1 else None,
        "restore": RestoreNote.from_wire(restore, "cluster restore").to_wire() if restore else None,
    }


def format_cluster(summary: dict[str, Any]) -> str:
    """The cluster summary as a few lines for ``streamrec status``."""
    generation = summary["generation"]
    if generation is None:
        return "cluster: no node agent has reported ('streamrec cluster' not running here)"
    lines = [f"cluster: generation {generation['number']} ({generation['state']})"]
    if restart := summary["last_restart"]:
        took = (restart["started_ms"] - restart["at_ms"]) / 1000
        at = datetime.fromtimestamp(restart["at_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        lines.append(
            f"last restart: {at}, {restart['cause']} (seen by {restart['by']}; "
            f"every node back in {took:.1f} s)"
        )
    if restore := summary.get("restore"):
        what = (
            f"{restore['checkpoint']} ({restore['saves']} saves)"
            if restore["checkpoint"]
            else "nothing (a fresh model)"
        )
        lines.append(
            f"restored: {what} in {restore['seconds']:.1f} s by generation {restore['generation']}"
        )
    for name, beat in summary["nodes"].items():
        if beat is None:
            lines.append(f"  {name:<12} no heartbeat")
            continue
        members = (
            ", ".join(
                f"{m['role'].lower()} {m['pid']} ({m.get('rss_bytes', 0) / 2**20:.0f} MiB)"
                for m in beat["members"]
            )
            or "none"
        )
        lines.append(
            f"  {name:<12} {beat['address']:<15} {beat['state']:<12} "
            f"generation {beat['generation']:<4} members: {members}"
        )
    return "\n".join(lines)


_COLUMNS = [  # (title, attribute, width, format)
    ("pass", "pass_id", 12, "{}"),
    ("rows", "rows", 7, "{}"),
    ("late", "late", 5, "{}"),
    ("late lbl", "late_labels", 8, "{}"),
    ("unmatched", "unmatched_labels", 9, "{}"),
    ("DLQ", "dead_letters", 4, "{}"),
    ("AUC", "auc", 6, "{:.4f}"),
    ("best", "best_auc", 6, "{:.4f}"),
    ("COPC", "copc", 5, "{:.3f}"),
    ("train s", "train_seconds", 7, "{:.1f}"),
    ("latency s", "latency_seconds", 9, "{:.1f}"),
    ("save", "save_kind", 5, "{}"),
    ("keys", "table_keys", 7, "{}"),
    ("gate", "gate", 6, "{}"),
    ("delivered", "delivered", 12, "{}"),
    ("caught up by", "caught_up_by", 12, "{}"),
    ("fresh s", "freshness_seconds", 7, "{:.1f}"),
    ("", "flag", 0, "{}"),
]


def task_names(rows: list[PassRow]) -> list[str]:
    """The further tasks any of ``rows`` measured, in the order they first appear."""
    return list(dict.fromkeys(name for r in rows for name in (r.tasks or {})))


def format_table(rows: list[PassRow]) -> str:
    """The rows as a fixed-width table, '-' where a stage has not reached the pass; a
    multi-task model's further tasks get an AUC column each, after the main task's."""

    def value_of(row: PassRow, attr: str) -> Any:
        if attr.startswith("task:"):
            return ((row.tasks or {}).get(attr[5:]) or {}).get("auc")
        return getattr(row, attr)

    def cell(row: PassRow, attr: str, width: int, fmt: str) -> str:
        value = value_of(row, attr)
        if not width:  # the flag, last and unpadded
            return str(value)
        text = "-" if value is None or value == "" else fmt.format(value)
        return f"{text:>{width}}" if width else text

    at = next(i for i, c in enumerate(_COLUMNS) if c[1] == "best_auc") + 1
    extra = [(f"AUC {t}", f"task:{t}", max(6, len(t) + 4), "{:.4f}") for t in task_names(rows)]
    columns = [*_COLUMNS[:at], *extra, *_COLUMNS[at:]]
    if any(r.judged_in is not None for r in rows):  # fresh labels: both, named
        columns = [
            ("fresh AUC", a, 9, f)
            if a == "auc"
            else ("fresh COPC", a, 10, f)
            if a == "copc"
            else (t, a, w, f)
            for t, a, w, f in columns
        ]
        at = next(i for i, c in enumerate(columns) if c[1] == "copc") + 1
        matured = [
            ("matured AUC", "matured_auc", 11, "{:.4f}"),
            ("matured COPC", "matured_copc", 12, "{:.3f}"),
        ]
        columns = [*columns[:at], *matured, *columns[at:]]
    header = " ".join(f"{title:>{width}}" for title, _, width, _ in columns).rstrip()
    lines = [header, "-" * len(header)]
    lines += [" ".join(cell(r, a, w, f) for _, a, w, f in columns).rstrip() for r in rows]
    return "\n".join(lines)
