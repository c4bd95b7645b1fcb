"""Matured metrics: a pass trained before its labels were final, judged again on them.

With a label written before its window closes, the pass's progressive read writes every
scored row's probability per task, its kind per task and its index (``ROW_VAR``: the part's
number in the pass << 32 | the row) to ``<scores>/<pass>-progressive/worker-<rank>.parquet``.
An impression's final labels come in the matured rows of a later pass (``matured_parts``;
``streaming.emit_plan``); the last of a pass ``W``'s impressions matures in the pass whose
window holds ``end(W) - 1 + mature - cut_delay``. Training that pass judges ``W``: each
worker takes its share of ``W``'s prediction files, finds each row's event id in ``W``'s
parts, joins the final labels, and each task's AUC buckets and sums over its observed rows
(each impression once per task) are all-reduced as a pass's metrics are. The metrics are
exact in the same sense as the progressive ones (``trainers.metrics``), on true labels.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streaming.emit_plan import plan_of
from streaming.pipe_reader import ROW_FILE_SHIFT
from streamrec.atomic_fs import write_bytes_atomic
from streamrec.config import PipelineConfig, kind_column
from streamrec.contracts.training import MaturedMetrics, PassMetrics
from streamrec.layout import Layout
from streamrec.passes import (
    PassManifest,
    RowKind,
    is_complete,
    pass_dir,
    read_manifest,
)
from trainers.metrics import metrics_from_stats, stats_from_predictions
from trainers.models import AUC_BUCKETS
from trainers.worker.pass_reads import global_stats
from trainers.worker.worker_context import WorkerContext

ROW_MASK = (1 << ROW_FILE_SHIFT) - 1
log = logging.getLogger(__name__)


def predictions_path(cfg: PipelineConfig, pass_id: str, rank: int, workers: int) -> Path:
    """Where worker ``rank`` of ``workers`` keeps its progressive predictions of ``pass_id``."""
    name = f"worker-{rank}-of-{workers}.parquet"
    return Layout.of(cfg.paths).progressive_scores(pass_id) / name


def _newest_scores(cfg: PipelineConfig, pass_id: str) -> list[Path]:
    """The prediction files of the cluster that last scored ``pass_id`` (a pass trained
    again by a cluster of another size leaves the older files beside)."""
    folder = Layout.of(cfg.paths).progressive_scores(pass_id)
    runs: dict[str, list[Path]] = {}
    for path in folder.glob("worker-*-of-*.parquet"):
        runs.setdefault(path.stem.rpartition("-of-")[2], []).append(path)
    if not runs:
        return []
    newest = max(runs.values(), key=lambda paths: max(p.stat().st_mtime for p in paths))
    return sorted(newest)


def write_predictions(
    path: Path,
    rows: np.ndarray,
    scores: dict[str, tuple[np.ndarray, np.ndarray]],
    kinds: dict[str, np.ndarray],
) -> None:
    """Write each scored row's index, and per task its probability and kind."""
    columns: dict[str, np.ndarray] = {"row": rows.astype(np.int64)}
    for task, (p, _) in scores.items():
        columns[f"p_{task}"] = p.astype(np.float32)
        columns[kind_column(task)] = kinds[task].astype(np.int8)
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    write_bytes_atomic(path, sink.getvalue().to_pybytes())  # whole or absent to the judge


def pass_files(cfg: PipelineConfig, manifest: PassManifest) -> list[str]:
    """A pass's files in the order training numbers them: its parts, then (an after_wait
    label's delay models train on them) its matured parts."""
    directory = pass_dir(cfg.paths.data_root, manifest.pass_id)
    files = [str(directory / p.file) for p in manifest.parts]
    if any(label.emit == "after_wait" for label in cfg.feature_schema.labels):
        files += [str(directory / p.file) for p in manifest.matured_parts]
    return files


def judged_pass(cfg: PipelineConfig, pass_id: str) -> str | None:
    """The pass whose last impressions mature in ``pass_id`` (None: no label matures
    later than its rows are written)."""
    plan, clock = plan_of(cfg), cfg.passes.clock
    if not plan.delayed:
        return None
    width, lag = clock.width_ms, plan.mature_ms - plan.cut_delay_ms
    start = clock.window(pass_id)[0]
    end = -(-(start - lag + 1) // width) * width  # the window end in [start-lag+1, +width)
    return clock.id_at(end - width)


def _matured_labels(cfg: PipelineConfig, judged: str, through: str) -> pa.Table:
    """The final labels (event id and label columns) written from ``judged`` through
    ``through``: where ``judged``'s impressions matured."""
    clock, root = cfg.passes.clock, cfg.paths.data_root
    columns = ["event_id", *cfg.feature_schema.label_columns]
    tables, pass_id = [], judged
    while pass_id <= through:
        directory = pass_dir(root, pass_id)
        if is_complete(directory):
            for part in read_manifest(directory).matured_parts:
                tables.append(pq.read_table(directory / part.file, columns=columns))
        pass_id = clock.next(pass_id)
    if not tables:
        return pa.table(
            {c: pa.array([], pa.string() if c == "event_id" else pa.int8()) for c in columns}
        )
    return pa.concat_tables(tables, promote_options="permissive")


def _event_ids(files: list[str], rows: np.ndarray) -> pa.Array:
    """The event id of each row index into ``files``."""
    numbers, lines = rows >> ROW_FILE_SHIFT, rows & ROW_MASK
    ids = np.empty(len(rows), dtype=object)
    for number in np.unique(numbers):
        mine = numbers == number
        column = pq.read_table(files[int(number)], columns=["event_id"])["event_id"]
        ids[mine] = column.take(pa.array(lines[mine])).to_numpy(zero_copy_only=False)
    return pa.array(ids, pa.string())


def judge(ctx: WorkerContext, pass_id: str) -> MaturedMetrics | None:
    """Every worker: the matured metrics of the pass whose impressions finished maturing in
    ``pass_id`` (None when there is none, or it was not scored by this cluster)."""
    cfg = ctx.cfg
    judged = judged_pass(cfg, pass_id)
    if judged is None:
        return None
    directory = pass_dir(cfg.paths.data_root, judged)
    found = _newest_scores(cfg, judged)
    if not is_complete(directory) or not found:  # the same answer on every worker
        log.info("pass %s: no progressive scores of pass %s to judge", pass_id, judged)
        return None
    files = pass_files(cfg, read_manifest(directory))
    mine = found[ctx.rank :: ctx.workers]
    scored = pa.concat_tables([pq.read_table(f) for f in mine]) if mine else None
    labels = _matured_labels(cfg, judged, pass_id)
    tasks: dict[str, PassMetrics] = {}
    schema = cfg.feature_schema
    column_of = {x.name: c for x, c in zip(schema.labels, schema.label_columns, strict=True)}
    for task in ctx.graph.tasks:
        column = column_of[task]
        p, y = np.empty(0), np.empty(0)
        if scored is not None and scored.num_rows:
            observed = scored.filter(pc.equal(scored[kind_column(task)], int(RowKind.OBSERVED)))
            rows = observed["row"].to_numpy()
            ids = _event_ids(files, rows)
            mine_scored = pa.table({"event_id": ids, "p": observed[f"p_{task}"]})
            joined = mine_scored.join(labels.select(["event_id", column]), "event_id")
            p, y = joined["p"].to_numpy(), joined[column].to_numpy()
        # every worker all-reduces every task, in the graph's order
        tasks[task] = metrics_from_stats(*global_stats(stats_from_predictions(p, y, AUC_BUCKETS)))
    return MaturedMetrics(pass_id=judged, judged_in=pass_id, tasks=tasks)
