"""Reading a pass: this worker's files through Paddle's datasets (QueueDataset streamed by
the pipe reader, or InMemoryDataset), scored or trained on, and the global metric sums.

``as_text`` converts the worker's Parquet parts to MultiSlot text once per pass; every read
of the pass streams those files (``every``: every k-th row for a sampled score).
``run_read`` runs one read and returns each task's AUC buckets and sums, all-reduced over
workers.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from streaming.pipe_reader import ROW_FILE_SHIFT, convert_file, text_command
from streamrec.config import RunnerConfig
from streamrec.layout import Layout
from streamrec.passes import RowKind
from trainers.metrics import STAT_NAMES, stats_from_predictions
from trainers.models import AUC_BUCKETS, TaskGraph
from trainers.worker import dense_tables
from trainers.worker.instance_dump import point_dump, read_dump
from trainers.worker.worker_context import WorkerContext


def _scope_array(name: str) -> np.ndarray:
    import paddle

    return np.array(paddle.static.global_scope().find_var(name).get_tensor())


def _reset_stats(ctx: WorkerContext) -> None:
    import paddle

    scope = paddle.static.global_scope()
    for task in ctx.graph.tasks.values():
        for var in task.stat_vars.values():
            tensor = scope.find_var(var.name).get_tensor()
            tensor.set(np.zeros_like(np.array(tensor)), paddle.CPUPlace())


Stats = tuple[np.ndarray, np.ndarray, dict[str, float]]
TaskStats = dict[str, Stats]  # task (label name) -> its stats, the main task first
# what a read's caller keeps of each scored row: its index, per task (score, label) and kind
KeepScores = Callable[
    [np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]], None
]


def accumulated_stats(task: TaskGraph) -> Stats:
    """This worker's AUC buckets and sums from a task's accumulators."""
    stats = task.stat_vars

    def read(name: str) -> np.ndarray:
        return _scope_array(stats[name].name).reshape(-1).astype(np.float64)

    return read("auc_pos"), read("auc_neg"), {n: float(read(n)[0]) for n in STAT_NAMES}


def global_stats(local: Stats) -> Stats:
    """Every worker's buckets and sums, summed (a gloo all-reduce)."""
    from paddle.distributed import fleet

    pos, neg, sums = local
    total = np.asarray(fleet.metrics.sum(np.concatenate([pos, neg, [sums[n] for n in STAT_NAMES]])))
    k = len(pos)
    return total[:k], total[k : 2 * k], dict(zip(STAT_NAMES, total[2 * k :].tolist(), strict=True))


def reader_threads(ctx: WorkerContext, files: list[str]) -> int:
    """Reader threads for ``files``: ``runner.thread_num``, at most one a file."""
    # QueueDataset aborts (glog CHECK) when a worker has fewer files than threads.
    return max(1, min(ctx.cfg.model.runner.thread_num, len(files)))


# Scoring updates nothing, so its batches need not be training's: one sparse pull per
# batch was most of a score's cost at training's 128 rows (a 50,000-row sample: 0.65 s),
# and still a third of it at 1,024 (bench/train.py's sampled score 0.15-0.28 s, against
# 0.12-0.14 s at 4,096; docs/decisions/)
SCORE_BATCH_SIZE = 4096


def training_batch_size(runner: RunnerConfig, share: int) -> int:
    """Rows per training batch for a worker's ``share`` of a pass: enough for
    ``min_batches_per_pass`` batches, within ``min_batch_size`` and ``batch_size``. A large
    pass trains in large batches (less per-batch work, fewer pushes); a small one keeps the
    dense steps it needs to learn (docs/decisions/, "A steady model")."""
    wanted = math.ceil(share / runner.min_batches_per_pass)
    return max(1, min(runner.batch_size, max(runner.min_batch_size, wanted)))


def scoring_batch_size(runner: RunnerConfig) -> int:
    """Rows per batch of a read that only scores: at least ``SCORE_BATCH_SIZE``."""
    return max(SCORE_BATCH_SIZE, runner.batch_size)


def queue_dataset(
    ctx: WorkerContext, files: list[str], threads: int, batch: int, every: int = 1
) -> Any:
    """The pass's text files streamed (``every``: every k-th row of each) in batches of
    ``batch`` rows."""
    import paddle

    dataset = paddle.distributed.QueueDataset()
    dataset.init(
        use_var=ctx.graph.use_vars,
        pipe_command=text_command(every),
        batch_size=batch,
        thread_num=threads,
    )
    dataset.set_filelist(files)
    return dataset


def in_memory_dataset(
    ctx: WorkerContext,
    files: list[str],
    threads: int,
    command: str,
    batch: int,
    ins_id: bool = False,
) -> Any:
    """``files`` loaded into memory through the pipe ``command``, in batches of ``batch``
    rows; ``ins_id``: each row carries its event id (for dumps)."""
    # paddle.distributed.InMemoryDataset().global_shuffle(fleet) raises AttributeError in
    # 2.6.2; the base DatasetFactory one shuffles across workers (DESIGN.md).
    from paddle.base import DatasetFactory

    dataset = DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(ctx.graph.use_vars)
    dataset.set_pipe_command(command)
    dataset.set_parse_ins_id(ins_id)
    dataset.set_batch_size(batch)
    dataset.set_thread(threads)
    dataset.set_filelist(files)
    dataset.load_into_memory()
    return dataset


def run_read(
    ctx: WorkerContext,
    dataset: Any,
    phase: str,
    threads: int,
    keep: KeepScores | None = None,
    on_final: frozenset[str] = frozenset(),
    fresh_average: bool = True,
) -> TaskStats:
    """Score (``phase`` "test") or train on this worker's part of the pass, then each
    task's global buckets and sums (``metrics_from_stats`` makes them metrics). With one
    reader thread they come from the graph's accumulators; with more, from every instance's
    dumped predictions and labels (the threads race on the accumulators, see
    ``instance_dump``). A score runs the forward-only program (``WorkerContext.scoring``).
    With fresh labels each task is measured on the rows that train it, or (``on_final``)
    on the matured rows; ``keep`` is handed each scored row's index, scores and kinds.
    ``fresh_average`` False: a later read of a pass trained in steps, whose iterates add to
    the earlier reads' (``dense_average``)."""
    import paddle

    program = paddle.static.default_main_program() if phase == "train" else ctx.scoring
    dump = Layout.of(ctx.cfg.paths).metric_dumps(ctx.rank, phase)
    tasks, conditionals = ctx.graph.tasks, ctx.graph.conditionals
    kinds = [t.kind.name for t in tasks.values() if t.kind is not None]
    fields = [name for t in tasks.values() for name in (t.predict.name, t.label.name)] + kinds
    # a conditional task needs each row's scores, a fresh label the rows that train it:
    # dumped, as several threads need them too
    dumped = threads > 1 or bool(conditionals) or bool(kinds)
    indexed = keep is not None and ctx.graph.row_index is not None
    if indexed:
        fields.append(ctx.graph.row_index)
    point_dump(program, fields, dump if dumped else None)
    _reset_stats(ctx)
    rounds = ctx.sync if phase == "train" else None
    if rounds is not None:
        rounds.begin()
    if ctx.average is not None and ctx.chain:  # a fresh model keeps its last iterate
        if phase != "train":
            ctx.average.hold()
        elif fresh_average:
            ctx.average.begin()
        else:
            ctx.average.resume()
    if phase == "train":
        dense_tables.training_ran()
    else:  # the scoring program's device worker reads the dense parameters from the scope
        dense_tables.pull()
    if dataset is not None:
        run = ctx.exe.infer_from_dataset if phase == "test" else ctx.exe.train_from_dataset
        run(program=program, dataset=dataset, debug=False)
    if rounds is not None:  # a worker without data still joins the others' rounds
        rounds.finish()
    # every worker all-reduces the tasks in the same order: the graph's
    if not dumped:
        return {name: global_stats(accumulated_stats(task)) for name, task in tasks.items()}
    values = read_dump(dump, len(fields))
    shutil.rmtree(dump)
    scores = {name: (values[2 * i], values[2 * i + 1]) for i, name in enumerate(tasks)}
    # each task is measured on the rows that train it (with a fresh label: observed rows
    # and duplicates; else every row)
    trained = {name: np.ones(len(scores[name][0]), dtype=bool) for name in tasks}
    kind_values = values[2 * len(tasks) : 2 * len(tasks) + len(kinds)]
    row_kinds = dict(zip(tasks, kind_values, strict=False))  # none without fresh labels
    for name, kind in row_kinds.items():
        if name in on_final:  # measured on the rows whose labels are final
            trained[name] = kind == RowKind.MATURED
        else:
            trained[name] = (kind > RowKind.ABSENT) & (kind < RowKind.MATURED)
    if indexed and keep is not None:
        keep(values[-1].astype(np.int64), scores, row_kinds)
    local = {
        name: stats_from_predictions(p[trained[name]], y[trained[name]], AUC_BUCKETS)
        for name, (p, y) in scores.items()
    }
    for name, (task, given) in conditionals.items():
        rows = (scores[given][1] == 1) & trained[task] & trained[given]
        ratio = scores[task][0][rows] / np.maximum(scores[given][0][rows], 1e-7)
        local[name] = stats_from_predictions(
            np.clip(ratio, 0.0, 1.0), scores[task][1][rows], AUC_BUCKETS
        )
    return {name: global_stats(stats) for name, stats in local.items()}


def progressive_every(progressive: str, rows: int, sample_rows: int) -> int:
    """Every how many rows of each file the progressive scores read: 1 for ``separate``
    (and for a ``sample`` of a pass no larger than ``sample_rows``), 0 for ``in_train``."""
    if progressive == "in_train":
        return 0
    if progressive == "sample":
        return max(1, math.ceil(rows / sample_rows))
    return 1


def sampled_rows(parts: list[int], every: int) -> int:
    """Rows an ``every``-th-row read of files of ``parts`` rows gives (from each first row)."""
    return sum(math.ceil(n / every) for n in parts)


@contextmanager
def as_text(
    ctx: WorkerContext,
    parts: list[str],
    seconds: dict[str, float],
    numbers: list[int] | None = None,
) -> Iterator[list[str]]:
    """This worker's ``parts`` of a pass converted to MultiSlot text once, in local files
    that every read of the pass streams (``text_command``), removed after the pass;
    ``numbers``: each part's number in the pass (its rows' indexes, with fresh labels)."""
    root = Layout.of(ctx.cfg.paths).pass_text(ctx.rank)
    shutil.rmtree(root, ignore_errors=True)  # left by a worker killed mid-pass
    root.mkdir(parents=True)
    texts = [str(root / f"{i:05d}.txt") for i in range(len(parts))]
    try:
        with ctx.stage("convert", seconds), ThreadPoolExecutor(reader_threads(ctx, parts)) as pool:
            schema = ctx.cfg.feature_schema
            bases = [n << ROW_FILE_SHIFT for n in numbers or range(len(parts))]
            list(
                pool.map(
                    lambda a, b, n: convert_file(Path(a), Path(b), schema, n), parts, texts, bases
                )
            )
        yield texts
    finally:
        shutil.rmtree(root, ignore_errors=True)
