"""What a worker does for each command, on a typed context (``trainers.worker.worker_context``).

    train_steps the published steps of the open pass (``passes.step_seconds``) not trained
                yet: scored, then trained, as ``train`` does, kept in ``open_pass``; not saved
    train       score the pass, then train on it (progressive validation; with
                ``progressive: in_train`` the training run's own batch-before-update scores);
                a pass whose steps were trained: the rest of it, reported whole
                -> global metrics; row count checked against the manifest; in sync mode
                every batch ends in a round all workers join (``sync_mode``)
                -> the dense mean of the pass's iterates (``dense_average``), then the
                logit's bias refitted on the pass (``intercept``)
                -> checkpoint: a delta, or a base every N passes (``saves``)
    score       the model's predictions for a pass, without training (a skew check)
    maintain    after a day's last pass: fleet.shrink -> mode-3 save, the new base (``saves``)
    restore     at start: the newest complete base, then its deltas, loaded in order (``saves``)
    export      worker 0: the dense inference program and the spec of the saves that hold
                the sparse table (``exports``)

Reading a pass is ``pass_reads``. Every worker calls every step: Paddle's saves run on
worker 0 between barriers.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streaming.pipe_reader import pipe_command, text_command
from streamrec.contracts.training import ScoreReply, StepsReply, TaskResult, TrainResult
from streamrec.layout import Layout
from streamrec.passes import (
    PassManifest,
    pass_dir,
    pass_part,
    read_manifest,
    read_step,
    slice_step_part,
    step_dir,
)
from trainers.checkpoints import next_kind
from trainers.metrics import metrics_from_stats
from trainers.worker import dense_tables
from trainers.worker.instance_dump import point_dump, read_dump_with_ids
from trainers.worker.intercept import add_to_bias, intercept_shift
from trainers.worker.matured import judge, pass_files, predictions_path, write_predictions
from trainers.worker.open_pass import OpenPass, added
from trainers.worker.pass_reads import (
    KeepScores,
    TaskStats,
    as_text,
    in_memory_dataset,
    progressive_every,
    queue_dataset,
    reader_threads,
    run_read,
    sampled_rows,
    scoring_batch_size,
    training_batch_size,
)
from trainers.worker.saves import checkpoint_summary, save
from trainers.worker.worker_context import WorkerContext

log = logging.getLogger(__name__)


def _test_then_train(
    ctx: WorkerContext,
    files: list[str],
    threads: int,
    every: int,
    batch: int,
    seconds: dict[str, float],
    keep: KeepScores | None = None,
    fresh_average: bool = True,
) -> tuple[TaskStats | None, TaskStats]:
    """Progressive validation and training on this worker's files of the pass.

    ``every`` > 0 scores every such row of the pass first (the model exactly as the previous
    pass left it: ``progressive`` separate or sample), then trains on the whole pass; 0
    (``in_train``) reads it once and takes the training run's metrics, where each batch is
    scored before its own update (no separate scores). Training reads ``batch`` rows a
    batch, scoring reads larger ones. A sample is its own read: a
    fraction of the pass, where the QueueDataset streams each read and the InMemoryDataset
    would otherwise score every row it loaded. ``fresh_average``: as ``run_read``'s."""
    from paddle.distributed import fleet

    scoring = scoring_batch_size(ctx.cfg.model.runner)
    if ctx.cfg.model.runner.reader_type == "QueueDataset":
        test = None
        if every:
            with ctx.stage("test", seconds):
                sample = queue_dataset(ctx, files, threads, scoring, every) if files else None
                test = run_read(ctx, sample, "test", threads, keep)
        with ctx.stage("train", seconds):
            train = run_read(
                ctx,
                queue_dataset(ctx, files, threads, batch) if files else None,
                "train",
                threads,
                None if every else keep,
                fresh_average=fresh_average,
            )
        return test, train
    test = None
    if every > 1:
        with ctx.stage("test", seconds):
            sample = in_memory_dataset(ctx, files, threads, text_command(every), scoring)
            try:
                test = run_read(ctx, sample, "test", threads, keep)
            finally:
                sample.release_memory()
    # InMemoryDataset: read the pass once, score it in file order, then shuffle it across
    # all workers (a collective: every worker takes part, with or without files) and train.
    with ctx.stage("load", seconds):
        dataset = in_memory_dataset(ctx, files, threads, text_command(), batch)
    try:
        if every == 1:
            with ctx.stage("test", seconds):
                test = run_read(ctx, dataset, "test", threads, keep)
        with ctx.stage("shuffle", seconds):
            dataset.global_shuffle(fleet)
        with ctx.stage("train", seconds):
            train = run_read(
                ctx,
                dataset,
                "train",
                threads,
                None if every else keep,
                fresh_average=fresh_average,
            )
    finally:
        dataset.release_memory()
    return test, train


def _refit_intercept(
    ctx: WorkerContext, files: list[str], threads: int, rows: int, seconds: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Score the pass as the model now stands (every k-th row, about ``intercept_rows``
    of the pass's ``rows``) and shift each task's logit bias so its predicted positives on
    them equal their positives (``intercept``); per task, the rows scored, their COPC
    before, and the shift."""
    runner = ctx.cfg.model.runner
    every = max(1, math.ceil(rows / runner.intercept_rows))
    scoring = scoring_batch_size(runner)
    specs = {label.name: label for label in ctx.cfg.feature_schema.labels}
    corrected = {n for n, x in specs.items() if x.loss_weights == "by_emit"}
    # a fresh label's rows are not its true labels: an at_once head's predictions over its
    # impressions (its observed rows, all negatives) are made to add up to its positives
    # (its duplicates), an after_wait head is refitted on the matured rows
    on_final = frozenset(n for n in corrected if specs[n].emit == "after_wait")
    apart = {n for n in corrected if specs[n].emit == "at_once"}
    with ctx.stage("refit", seconds):
        if runner.reader_type == "QueueDataset":
            stats = run_read(
                ctx,
                queue_dataset(ctx, files, threads, scoring, every) if files else None,
                "test",
                threads,
                on_final=on_final,
            )
        else:  # an in-memory run loads its own sample, as the pass's reads load theirs
            dataset = in_memory_dataset(ctx, files, threads, text_command(every), scoring)
            try:
                stats = run_read(ctx, dataset, "test", threads, on_final=on_final)
            finally:
                dataset.release_memory()
        # each head is refitted; a conditional task (a ratio of two heads) has no bias
        shifts = {
            task: intercept_shift(*stats[task][:2], positives_apart=task in apart)
            for task in ctx.graph.tasks
        }
        biases = {ctx.graph.tasks[task].logit_bias: shift for task, shift in shifts.items()}
        ctx.leader_only(lambda: add_to_bias(biases))
        dense_tables.pull()
    refits = {}
    for task in shifts:
        before = metrics_from_stats(*stats[task])
        refits[task] = {
            "rows": before.count,
            "every": every,
            "copc_before": before.copc,
            "shift": shifts[task],
        }
    return refits


def _expected_counts(
    manifest: PassManifest, main: str, every: int, fresh: bool
) -> tuple[int, int | None]:
    """The rows the main task trains on and scores, by the manifest: every row and the
    sampled ones; with a fresh label, the main task's observed rows and duplicates (a
    sample of them is scored, of a size the manifest cannot tell: taken as read)."""
    if not fresh:
        return manifest.rows, sampled_rows([p.rows for p in manifest.parts], max(every, 1))
    counts = manifest.counts.labels.get(main)
    rows = counts.observed + counts.duplicates if counts else 0
    return rows, rows if every <= 1 else None


def _open_pass(ctx: WorkerContext, pass_id: str) -> OpenPass | None:
    """The steps of ``pass_id`` this worker trained, taken (None: none); steps of another
    pass left open are dropped, logged: that pass was never trained after them."""
    opened, ctx.open_pass = ctx.open_pass, None
    if opened is not None and opened.pass_id != pass_id:
        log.error(
            "pass %s: %d rows of its steps were trained, but the pass was not: %s comes now",
            *(opened.pass_id, opened.rows, pass_id),
        )
        return None
    return opened


def train_steps(ctx: WorkerContext, pass_id: str, steps: tuple[str, ...]) -> StepsReply:
    """Score then train the ``steps`` (``"<partition>/<step>"``) of the open pass
    ``pass_id`` not trained yet, as ``train_pass`` does a pass, and keep what they measured
    in ``ctx.open_pass`` for the pass's own command; nothing is saved."""
    root = ctx.cfg.paths.data_root
    if not steps or (ctx.chain and pass_id <= ctx.chain[-1].pass_id):
        return StepsReply(pass_id=pass_id, steps=[], rows=0)  # nothing, or saved already
    files: list[tuple[str, str, int, str]] = []  # path, name in the pass, rows, step
    for name in steps:
        partition, step = (int(x) for x in name.split("/"))
        folder = step_dir(root, pass_id, partition, step)
        for part in read_step(folder).parts:
            in_pass = pass_part(partition, slice_step_part(step, part.file))
            files.append((str(folder / part.file), in_pass, part.rows, name))
    opened = ctx.open_pass
    if opened is None or opened.pass_id != pass_id:
        runner, rows = ctx.cfg.model.runner, sum(f[2] for f in files)
        # the pass's rows, guessed from the share of its window the steps cover
        share = max(int(s.split("/")[1]) for s in steps) / ctx.cfg.passes.steps_per_pass
        expected = max(1, math.ceil(rows / share))
        every = progressive_every(runner.progressive, expected, runner.progressive_rows)
        batch = training_batch_size(runner, math.ceil(expected / ctx.workers))
        opened = _open_pass(ctx, pass_id) or OpenPass(pass_id, every, batch)
        ctx.open_pass = opened
    todo = [f for f in files if f[1] not in opened.trained]
    seconds: dict[str, float] = {}
    if todo:
        paths = [f[0] for f in todo]
        with as_text(ctx, paths[ctx.rank :: ctx.workers], seconds) as mine:
            threads = reader_threads(ctx, mine)
            first = not opened.trained
            tested, trained = _test_then_train(
                ctx, mine, threads, opened.every, opened.batch, seconds, fresh_average=first
            )
        opened.took(tested, trained, seconds)
        opened.newest = [(f[0], f[2]) for f in todo]
        opened.trained |= {f[1] for f in todo}
        opened.rows += sum(f[2] for f in todo)
    names = sorted({f[3] for f in todo})
    return StepsReply(pass_id=pass_id, steps=names, rows=sum(f[2] for f in todo), seconds=seconds)


def train_pass(ctx: WorkerContext, pass_id: str, command_id: str) -> TrainResult:
    """Progressive validation on the pass, training on it, then its checkpoint (a delta, or
    a base every ``base_every_passes``): the pass counts as trained once the save is durable.
    A pass whose steps this worker trained (``train_steps``) trains the rest of its rows
    and reports the whole; the intercept is then refitted on those rows and the newest
    step's, the freshest."""
    started_at = time.time()
    directory = pass_dir(ctx.cfg.paths.data_root, pass_id)
    manifest = read_manifest(directory)
    schema = ctx.cfg.feature_schema
    # with an after_wait label, the matured rows too: they train its delay models (their
    # kind keeps them out of the tasks' losses and metrics)
    files = pass_files(ctx.cfg, manifest)
    keep = None
    if schema.fresh_labels:  # the progressive scores, for the matured metrics
        path = predictions_path(ctx.cfg, pass_id, ctx.rank, ctx.workers)
        keep = partial(write_predictions, path)
    seconds: dict[str, float] = {}
    runner = ctx.cfg.model.runner
    stepped = _open_pass(ctx, pass_id)
    if stepped is None:
        every = progressive_every(runner.progressive, manifest.rows, runner.progressive_rows)
        batch = training_batch_size(runner, math.ceil(manifest.rows / ctx.workers))
    else:
        every, batch = stepped.every, stepped.batch
        files = [f for f in files if Path(f).name not in stepped.trained]
    part_rows = {p.file: p.rows for p in [*manifest.parts, *manifest.matured_parts]}
    rows = sum(part_rows[Path(f).name] for f in files)
    fresher = stepped.newest if stepped is not None and runner.intercept == "refit" else []
    to_train, to_refit = (
        files[ctx.rank :: ctx.workers],
        [p for p, _ in fresher][ctx.rank :: ctx.workers],
    )
    numbers = [
        *range(ctx.rank, len(files), ctx.workers),
        *(len(files) + i for i in range(ctx.rank, len(fresher), ctx.workers)),
    ]
    with as_text(ctx, to_train + to_refit, seconds, numbers) as texts:
        mine = texts[: len(to_train)]
        # changing the thread count between runs of one process aborts Paddle (a CHECK in
        # dist_multi_trainer), so every read of the pass shares ``threads``
        threads = reader_threads(ctx, mine)
        tested, trained = _test_then_train(
            ctx, mine, threads, every, batch, seconds, keep, fresh_average=stepped is None
        )
        if stepped is not None:
            tested = added(stepped.tested, tested)
            trained = added(stepped.train, trained) or trained
        averaged, refits = None, {}
        if ctx.average is not None and ctx.average.training:  # summed: not a fresh model's
            with ctx.stage("average", seconds):
                averaged = ctx.average.apply(ctx.leader_only)
        if runner.intercept == "refit":
            refit_rows = rows + sum(r for _, r in fresher)
            refits = _refit_intercept(ctx, texts, threads, refit_rows, seconds)
    main, *others = [*ctx.graph.tasks, *ctx.graph.conditionals]
    tests = {t: metrics_from_stats(*s) for t, s in (tested or trained).items()}
    trains = {t: metrics_from_stats(*s) for t, s in trained.items()}
    train, test = trains[main], tests[main]
    trains_on, scored = _expected_counts(manifest, main, every, bool(schema.fresh_labels))
    counts_match = train.count == trains_on and (scored is None or test.count == scored)
    if not counts_match:
        log.error(
            "pass %s: scored %d rows (expected %d) and trained on %d, the manifest has %d",
            *(pass_id, test.count, scored, train.count, trains_on),
        )
    with ctx.stage("matured", seconds):
        matured = judge(ctx, pass_id)
    result = TrainResult(  # its contract checked before the save makes the pass count
        pass_id=pass_id,
        rows=manifest.rows,
        count_matches_manifest=counts_match,
        test=test,
        train=train,
        seconds=seconds,
        workers=ctx.workers,
        reader=runner.reader_type,
        progressive=runner.progressive,
        progressive_every=every,
        batch_size=batch,
        sync_mode=runner.sync_mode,
        sync_rounds=ctx.sync.summary() if ctx.sync else None,
        dense_average=averaged,
        intercept=refits.get(main),
        tasks={
            t: TaskResult(test=tests[t], train=trains[t], intercept=refits.get(t)) for t in others
        },
        matured=[matured] if matured is not None else [],
        started_at=started_at,  # epoch seconds: scheduling latency and freshness
        trained_at=time.time(),
        rows_in_steps=stepped.rows if stepped is not None else 0,
        seconds_in_steps=stepped.seconds if stepped is not None else {},
    )
    kind = next_kind(ctx.chain, ctx.cfg.checkpoints.base_every_passes)
    with ctx.stage("save", seconds, blocking=True):
        info = save(ctx, pass_id, kind, manifest, result.to_wire())
    saved = {"checkpoint": checkpoint_summary(ctx, info), "seconds": seconds}
    return result.model_copy(update=saved)


def score(ctx: WorkerContext, pass_id: str, command_id: str) -> ScoreReply:
    """This worker's predictions for its files of ``pass_id`` with the model as it stands
    (inference only; unseen keys pull zeros, as in training), keyed by event id: the
    cluster's side of a training/serving skew check. The rows carry their event ids as
    Paddle instance ids (an in-memory dataset that parses them), and the dump writes them
    beside each prediction."""

    directory = pass_dir(ctx.cfg.paths.data_root, pass_id)
    files = [str(directory / p.file) for p in read_manifest(directory).parts]
    mine = files[ctx.rank :: ctx.workers]
    out = Layout.of(ctx.cfg.paths).scores_dir(pass_id, command_id)
    dump = out / f"dump-{ctx.rank}"
    program = ctx.scoring
    tasks = ctx.graph.tasks
    point_dump(program, [task.predict.name for task in tasks.values()], dump)
    try:
        if mine:
            command = pipe_command(ctx.cfg.feature_schema, ins_id=True)
            threads = reader_threads(ctx, mine)
            batch = scoring_batch_size(ctx.cfg.model.runner)
            dataset = in_memory_dataset(ctx, mine, threads, command, batch, ins_id=True)
            try:
                dense_tables.pull()  # the scoring program reads them from the scope
                ctx.exe.infer_from_dataset(program=program, dataset=dataset, debug=False)
            finally:
                dataset.release_memory()
    finally:
        point_dump(program, [], None)
    ids, predictions = read_dump_with_ids(dump, len(tasks))
    shutil.rmtree(dump)
    path = out / f"worker-{ctx.rank}.parquet"
    # the main task's as p_click, as ever; a further task's as p_<its label>
    names = ["p_click", *(f"p_{task}" for task in list(tasks)[1:])]
    columns: dict[str, Any] = {"event_id": [unquote(i) for i in ids]}
    columns |= {name: p.astype(np.float32) for name, p in zip(names, predictions, strict=True)}
    pq.write_table(pa.table(columns), path)
    return ScoreReply(pass_id=pass_id, rank=ctx.rank, rows=len(ids), predictions=str(path))
