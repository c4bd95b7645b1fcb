"""What a worker does for each command, on a typed context. Collectives live only here.

    train       score the pass, then train on it (progressive validation; with
                ``progressive: in_train`` the training run's own batch-before-update scores)
                -> global metrics; row count checked against the manifest; in sync mode
                every batch ends in a round all workers join (``sync_mode``)
                -> the dense mean of the pass's iterates (``dense_average``), then the
                logit's bias refitted on the pass (``intercept``)
                -> checkpoint: a delta, or a base every N passes (``checkpoints``)
    maintain    after a day's last pass: fleet.shrink -> mode-3 save, the new base
    restore     at start: the newest complete base, then its deltas, loaded in order
    export      worker 0: the dense inference program (pooled embeddings as feeds) with the
                dense tables pulled from the servers + the checkpoint chain that holds the
                sparse table -> export_spec.json -> _SUCCESS

Every worker calls every step: Paddle's saves run on worker 0 between barriers.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streaming.pipe_reader import LABEL_VAR, convert_file, pipe_command, text_command
from streamrec.atomic_fs import publish_dir, temp_dir_for
from streamrec.config import PipelineConfig
from streamrec.passes import PassManifest, pass_dir, read_manifest
from trainers import dense_tables
from trainers.checkpoints import (
    CheckpointInfo,
    CheckpointKind,
    apply_retention,
    list_checkpoints,
    next_kind,
    restore_chain,
    saved_keys,
    write_info,
)
from trainers.dense_average import IterateAverage
from trainers.export_spec import EXPORT_VERSION, ExportSpec, OnnxTwin, write_export_spec
from trainers.instance_dump import point_dump, read_dump, read_dump_with_ids
from trainers.intercept import add_to_bias, intercept_shift
from trainers.metrics import STAT_NAMES, metrics_from_stats, stats_from_predictions
from trainers.models import AUC_BUCKETS, ModelGraph
from trainers.onnx_twin import write_onnx_twin
from trainers.results import TrainResult
from trainers.strategy import saved_value_layout
from trainers.sync_mode import SyncRounds

log = logging.getLogger(__name__)
T = TypeVar("T")

EXPORT_MODEL_PREFIX = "model"


@dataclass
class WorkerContext:
    """Everything a worker's steps need, built once at start."""

    cfg: PipelineConfig
    graph: ModelGraph
    exe: Any
    rank: int
    workers: int
    # the stage and how long it may block heartbeats, e.g. into the worker's heartbeat
    report: Callable[[str, float], None] = lambda stage, hold_s: None
    chain: list[CheckpointInfo] = field(default_factory=list)  # the saves the model is in
    table_keys: np.ndarray = field(  # worker 0: keys in the sparse table, from the saves
        default_factory=lambda: np.empty(0, dtype=np.uint64)
    )
    sync: SyncRounds | None = None  # sync mode: the per-batch rounds (``sync_mode``)
    average: IterateAverage | None = None  # dense_average: pass (``dense_average``)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @contextmanager
    def stage(self, name: str, seconds: dict[str, float], blocking: bool = False) -> Iterator[None]:
        """Report the stage ``name`` and record its wall time (seconds) in ``seconds``.
        ``blocking``: a call on the whole table that holds the GIL until it returns (a
        save, a shrink), so the heartbeat sent now must outlive it (``blocking_hold_s``)."""
        self.report(name, blocking_hold_s(self.table_size()) if blocking else 0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds[name] = round(time.perf_counter() - start, 3)

    def table_size(self) -> int:
        """Keys in the sparse table as of the newest save (0 for a fresh model)."""
        return self.chain[-1].table_keys if self.chain else 0

    def leader_only(self, step: Callable[[], T]) -> T | None:
        """Run ``step`` on worker 0 only, then wait for it on every worker (an all-reduce);
        if it raised, every worker raises. An exception must not let worker 0 skip the
        collective the others are waiting in: the cluster would hang."""
        error: Exception | None = None
        value = None
        if self.leader:
            try:
                value = step()
            except Exception as e:  # re-raised below, once every worker knows
                error = e
        failed = agree_any(error is not None)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError("worker 0 failed this step; its log has the cause")
        return value


# Measured on bench/scale.py's tables (2 cores): a base save takes 6.4 s per million keys
# and heartbeats stop for all of it; a delta of 2M new keys 5-12 s. The hold is five
# times that, so a heartbeat outlives the call on a busier or slower machine.
BLOCKING_S_PER_MILLION_KEYS = 30.0
BLOCKING_S_MIN = 60.0


def blocking_hold_s(table_keys: int) -> float:
    """How long a heartbeat sent before a blocking call on a table of ``table_keys`` keys
    must live: the client waits that long before it calls the cluster gone."""
    return BLOCKING_S_MIN + BLOCKING_S_PER_MILLION_KEYS * table_keys / 1e6


def agree_any(flag: bool) -> bool:
    """True on every worker if ``flag`` is true on any worker (a gloo all-reduce)."""
    from paddle.distributed import fleet

    return bool(fleet.util.all_reduce(np.array([int(flag)]), "max")[0])


def _scope_array(name: str) -> np.ndarray:
    import paddle

    return np.array(paddle.static.global_scope().find_var(name).get_tensor())


def _reset_stats(ctx: WorkerContext) -> None:
    import paddle

    scope = paddle.static.global_scope()
    for var in ctx.graph.stat_vars.values():
        tensor = scope.find_var(var.name).get_tensor()
        tensor.set(np.zeros_like(np.array(tensor)), paddle.CPUPlace())


Stats = tuple[np.ndarray, np.ndarray, dict[str, float]]


def _accumulated_stats(ctx: WorkerContext) -> Stats:
    """This worker's AUC buckets and sums from the graph's accumulators."""
    stats = ctx.graph.stat_vars

    def read(name: str) -> np.ndarray:
        return _scope_array(stats[name].name).reshape(-1).astype(np.float64)

    return read("auc_pos"), read("auc_neg"), {n: float(read(n)[0]) for n in STAT_NAMES}


def _global_stats(local: Stats) -> Stats:
    """Every worker's buckets and sums, summed (a gloo all-reduce)."""
    from paddle.distributed import fleet

    pos, neg, sums = local
    total = np.asarray(fleet.metrics.sum(np.concatenate([pos, neg, [sums[n] for n in STAT_NAMES]])))
    k = len(pos)
    return total[:k], total[k : 2 * k], dict(zip(STAT_NAMES, total[2 * k :].tolist(), strict=True))


def _threads(ctx: WorkerContext, files: list[str]) -> int:
    # QueueDataset aborts (glog CHECK) when a worker has fewer files than threads.
    return max(1, min(ctx.cfg.model.runner.thread_num, len(files)))


# Scoring updates nothing, so its batches need not be training's: one sparse pull per
# batch was most of a score's cost at training's 128 rows (a 50,000-row sample: 0.65 s).
SCORE_BATCH_SIZE = 1024


def _batch_size(ctx: WorkerContext, scoring: bool) -> int:
    """Rows per batch: training's, or at least ``SCORE_BATCH_SIZE`` for a read that scores."""
    size = ctx.cfg.model.runner.batch_size
    return max(SCORE_BATCH_SIZE, size) if scoring else size


def _queue_dataset(
    ctx: WorkerContext, files: list[str], threads: int, every: int = 1, scoring: bool = False
) -> Any:
    """The pass's text files streamed (``every``: every k-th row of each), in training's
    batches or, ``scoring``, larger ones."""
    import paddle

    dataset = paddle.distributed.QueueDataset()
    dataset.init(
        use_var=ctx.graph.use_vars,
        pipe_command=text_command(every),
        batch_size=_batch_size(ctx, scoring),
        thread_num=threads,
    )
    dataset.set_filelist(files)
    return dataset


def _in_memory_dataset(
    ctx: WorkerContext,
    files: list[str],
    threads: int,
    command: str,
    ins_id: bool = False,
    scoring: bool = False,
) -> Any:
    """``files`` loaded into memory through the pipe ``command``; ``ins_id``: each row
    carries its event id (for dumps); ``scoring``: in scoring's larger batches."""
    # paddle.distributed.InMemoryDataset().global_shuffle(fleet) raises AttributeError in
    # 2.6.2; the base DatasetFactory one shuffles across workers (DESIGN.md).
    from paddle.base import DatasetFactory

    dataset = DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(ctx.graph.use_vars)
    dataset.set_pipe_command(command)
    dataset.set_parse_ins_id(ins_id)
    dataset.set_batch_size(_batch_size(ctx, scoring))
    dataset.set_thread(threads)
    dataset.set_filelist(files)
    dataset.load_into_memory()
    return dataset


def _run(ctx: WorkerContext, dataset: Any, phase: str, threads: int) -> Stats:
    """Score (``phase`` "test") or train on this worker's part of the pass, then the global
    buckets and sums (``metrics_from_stats`` makes them metrics). With one reader thread
    they come from the graph's accumulators; with more, from every instance's dumped
    prediction and label (the threads race on the accumulators, see ``instance_dump``)."""
    import paddle

    program = paddle.static.default_main_program()
    dump = Path(ctx.cfg.paths.work_root) / "metric-dumps" / f"worker-{ctx.rank}" / phase
    point_dump(program, [ctx.graph.predict.name, LABEL_VAR], dump if threads > 1 else None)
    _reset_stats(ctx)
    rounds = ctx.sync if phase == "train" else None
    if rounds is not None:
        rounds.begin()
    if ctx.average is not None and phase == "train" and ctx.chain:
        ctx.average.begin()  # a fresh model keeps its last iterate: nothing to sum
    if dataset is not None:
        # the main program for both: its fleet options make the device worker pull the dense
        # tables from the servers first (a clone(for_test=True) lost them, and segfaulted
        # in DownpourLiteWorker when given them: they are keyed by program id)
        run = ctx.exe.infer_from_dataset if phase == "test" else ctx.exe.train_from_dataset
        run(program=program, dataset=dataset, debug=False)
    if rounds is not None:  # a worker without data still joins the others' rounds
        rounds.finish()
    if threads == 1:
        return _global_stats(_accumulated_stats(ctx))
    scores, labels = read_dump(dump, 2)
    shutil.rmtree(dump)
    return _global_stats(stats_from_predictions(scores, labels, AUC_BUCKETS))


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


def _test_then_train(
    ctx: WorkerContext, files: list[str], threads: int, every: int, seconds: dict[str, float]
) -> tuple[Stats | None, Stats]:
    """Progressive validation and training on this worker's files of the pass.

    ``every`` > 0 scores every such row of the pass first (the model exactly as the previous
    pass left it: ``progressive`` separate or sample), then trains on the whole pass; 0
    (``in_train``) reads it once and takes the training run's metrics, where each batch is
    scored before its own update (no separate scores). A sample is its own read: a
    fraction of the pass, where the QueueDataset streams each read and the InMemoryDataset
    would otherwise score every row it loaded."""
    from paddle.distributed import fleet

    if ctx.cfg.model.runner.reader_type == "QueueDataset":
        test = None
        if every:
            with ctx.stage("test", seconds):
                sample = _queue_dataset(ctx, files, threads, every, scoring=True) if files else None
                test = _run(ctx, sample, "test", threads)
        with ctx.stage("train", seconds):
            train = _run(
                ctx, _queue_dataset(ctx, files, threads) if files else None, "train", threads
            )
        return test, train
    test = None
    if every > 1:
        with ctx.stage("test", seconds):
            sample = _in_memory_dataset(ctx, files, threads, text_command(every), scoring=True)
            try:
                test = _run(ctx, sample, "test", threads)
            finally:
                sample.release_memory()
    # InMemoryDataset: read the pass once, score it in file order, then shuffle it across
    # all workers (a collective: every worker takes part, with or without files) and train.
    with ctx.stage("load", seconds):
        dataset = _in_memory_dataset(ctx, files, threads, text_command())
    try:
        if every == 1:
            with ctx.stage("test", seconds):
                test = _run(ctx, dataset, "test", threads)
        with ctx.stage("shuffle", seconds):
            dataset.global_shuffle(fleet)
        with ctx.stage("train", seconds):
            train = _run(ctx, dataset, "train", threads)
    finally:
        dataset.release_memory()
    return test, train


def _refit_intercept(
    ctx: WorkerContext, files: list[str], threads: int, rows: int, seconds: dict[str, float]
) -> dict[str, Any]:
    """Score the pass as the model now stands (every k-th row, about ``intercept_rows``
    of the pass's ``rows``) and shift the logit's bias so its predicted clicks on them equal
    their clicks (``intercept``); the rows scored, their COPC before, and the shift."""
    runner = ctx.cfg.model.runner
    every = max(1, math.ceil(rows / runner.intercept_rows))
    with ctx.stage("refit", seconds):
        if runner.reader_type == "QueueDataset":
            pos, neg, sums = _run(
                ctx,
                _queue_dataset(ctx, files, threads, every, scoring=True) if files else None,
                "test",
                threads,
            )
        else:  # an in-memory run loads its own sample, as the pass's reads load theirs
            dataset = _in_memory_dataset(ctx, files, threads, text_command(every), scoring=True)
            try:
                pos, neg, sums = _run(ctx, dataset, "test", threads)
            finally:
                dataset.release_memory()
        shift = intercept_shift(pos, neg)
        ctx.leader_only(lambda: add_to_bias(ctx.graph.logit_bias, shift))
        dense_tables.pull()
    before = metrics_from_stats(pos, neg, sums)
    return {"rows": before.count, "every": every, "copc_before": before.copc, "shift": shift}


@contextmanager
def _as_text(
    ctx: WorkerContext, parts: list[str], seconds: dict[str, float]
) -> Iterator[list[str]]:
    """This worker's ``parts`` of a pass converted to MultiSlot text once, in local files
    that every read of the pass streams (``text_command``), removed after the pass."""
    root = Path(ctx.cfg.paths.work_root) / "pass-text" / f"worker-{ctx.rank}"
    shutil.rmtree(root, ignore_errors=True)  # left by a worker killed mid-pass
    root.mkdir(parents=True)
    texts = [str(root / f"{i:05d}.txt") for i in range(len(parts))]
    try:
        with ctx.stage("convert", seconds), ThreadPoolExecutor(_threads(ctx, parts)) as pool:
            schema = ctx.cfg.feature_schema
            list(pool.map(lambda a, b: convert_file(Path(a), Path(b), schema), parts, texts))
        yield texts
    finally:
        shutil.rmtree(root, ignore_errors=True)


def train_pass(ctx: WorkerContext, pass_id: str, command_id: str) -> dict[str, Any]:
    """Progressive validation on the pass, training on it, then its checkpoint (a delta, or
    a base every ``base_every_passes``): the pass counts as trained once the save is durable."""
    started_at = time.time()
    directory = pass_dir(ctx.cfg.paths.data_root, pass_id)
    manifest = read_manifest(directory)
    files = [str(directory / p.file) for p in manifest.parts]
    seconds: dict[str, float] = {}
    runner = ctx.cfg.model.runner
    every = progressive_every(runner.progressive, manifest.rows, runner.progressive_rows)
    with _as_text(ctx, files[ctx.rank :: ctx.workers], seconds) as mine:
        # changing the thread count between runs of one process aborts Paddle (a CHECK in
        # dist_multi_trainer), so every read of the pass shares ``threads``
        threads = _threads(ctx, mine)
        tested, trained = _test_then_train(ctx, mine, threads, every, seconds)
        averaged = intercept = None
        if ctx.average is not None and ctx.average.training:  # summed: not a fresh model's
            with ctx.stage("average", seconds):
                averaged = ctx.average.apply(ctx.leader_only)
        if runner.intercept == "refit":
            intercept = _refit_intercept(ctx, mine, threads, manifest.rows, seconds)
    train = metrics_from_stats(*trained)
    test = metrics_from_stats(*tested) if tested is not None else train
    scored = sampled_rows([p.rows for p in manifest.parts], max(every, 1))
    counts_match = test.count == scored and train.count == manifest.rows
    if not counts_match:
        log.error(
            "pass %s: scored %d rows (expected %d) and trained on %d, the manifest has %d",
            *(pass_id, test.count, scored, train.count, manifest.rows),
        )
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
        sync_mode=runner.sync_mode,
        sync_rounds=ctx.sync.summary() if ctx.sync else None,
        dense_average=averaged,
        intercept=intercept,
        started_at=started_at,  # epoch seconds: scheduling latency and freshness
        trained_at=time.time(),
    )
    kind = next_kind(ctx.chain, ctx.cfg.checkpoints.base_every_passes)
    with ctx.stage("save", seconds, blocking=True):
        info = _save(ctx, pass_id, kind, command_id, manifest, result.reply())
    saved = {"checkpoint": _checkpoint_summary(ctx, info), "seconds": seconds}
    return result.model_copy(update=saved).reply()


def maintain(ctx: WorkerContext, pass_id: str, command_id: str) -> dict[str, Any]:
    """The daily sequence after the last pass of a logical day: shrink (decay show/click,
    delete keys below ``delete_threshold`` or unseen too long), then a mode-3 save (every
    key; +1 to every key's unseen-days clock), which becomes the new base."""
    from paddle.distributed import fleet

    if not ctx.chain or ctx.chain[-1].pass_id != pass_id:
        raise ValueError(
            f"maintenance after {pass_id} asked, but the model's newest pass is "
            f"{ctx.chain[-1].pass_id if ctx.chain else 'none'}: train {pass_id} first"
        )
    keys_before = ctx.chain[-1].table_keys
    seconds: dict[str, float] = {}
    with ctx.stage("shrink", seconds, blocking=True):
        fleet.shrink()
    manifest = read_manifest(pass_dir(ctx.cfg.paths.data_root, pass_id))
    with ctx.stage("save", seconds, blocking=True):
        info = _save(ctx, pass_id, "daily", command_id, manifest, ctx.chain[-1].train)
    return {
        "pass_id": pass_id,
        "day": pass_id[:8],
        "keys_before": keys_before,
        "checkpoint": _checkpoint_summary(ctx, info),
        "seconds": seconds,
    }


def _checkpoint_summary(ctx: WorkerContext, info: CheckpointInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "kind": info.kind,
        "path": str(Path(ctx.cfg.paths.checkpoint_root) / info.name),
        "table_keys": info.table_keys,
        "saved_keys": info.saved_keys,
    }


def _save(
    ctx: WorkerContext,
    pass_id: str,
    kind: CheckpointKind,
    command_id: str,
    manifest: PassManifest,
    train: dict[str, Any] | None,
) -> CheckpointInfo:
    """Save the servers' tables as ``kind`` after ``pass_id``: every worker calls the save
    (it runs on worker 0 between barriers); worker 0 writes CHECKPOINT.json into the
    temporary directory, renames it into place and applies retention; a barrier later every
    worker adopts the same chain."""
    from paddle.distributed import fleet

    root = Path(ctx.cfg.paths.checkpoint_root)
    root.mkdir(parents=True, exist_ok=True)
    parent = ctx.chain[-1] if ctx.chain else None
    info = CheckpointInfo(
        pass_id=pass_id,
        kind=kind,
        seq=parent.seq + 1 if parent else 0,
        parent=parent.name if parent and kind == "delta" else None,
        day=pass_id[:8] if kind == "daily" else None,
        table_keys=0,
        saved_keys=0,
        consumed_to=manifest.consumed_to,
        resume_offsets=manifest.resume_offsets,
        train=train,
    )
    tmp = root / f".{info.name}.tmp-{command_id}"
    final = root / info.name
    settled = ctx.leader_only(dense_tables.settle)
    if settled is not None:
        log.info("dense tables settled %.3f s after the pass", settled)
    fleet.save_persistables(ctx.exe, str(tmp), mode=info.mode)

    def publish() -> CheckpointInfo:
        keys = saved_keys(tmp)
        ctx.table_keys = keys if info.is_base else np.union1d(ctx.table_keys, keys)
        counted = info.model_copy(
            update={"table_keys": len(ctx.table_keys), "saved_keys": len(keys)}
        )
        write_info(tmp, counted)
        stale = root / f".{info.name}.stale-{command_id}"
        if final.exists():  # left by a lineage the restored model does not descend from
            final.rename(stale)
        publish_dir(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
        if info.is_base:
            apply_retention(root, ctx.cfg.checkpoints.keep_bases)
        return counted

    info = ctx.leader_only(publish) or info
    ctx.chain = [info] if info.is_base else [*ctx.chain, info]
    log.info("checkpoint %s saved (%d keys in the table)", info.name, info.table_keys)
    return info


def restore(ctx: WorkerContext) -> CheckpointInfo | None:
    """Load the newest complete chain (base, then its deltas in order) into the servers.
    Every worker calls it at start; an empty checkpoint root starts a fresh model."""
    from paddle.distributed import fleet

    root = Path(ctx.cfg.paths.checkpoint_root)
    chain = restore_chain(root)
    for info in chain:
        fleet.load_model(str(root / info.name), mode=0)

    def count_keys() -> None:
        for info in chain:
            keys = saved_keys(root / info.name)
            ctx.table_keys = keys if info.is_base else np.union1d(ctx.table_keys, keys)

    ctx.leader_only(count_keys)
    ctx.chain = chain
    if chain:
        log.info(
            "restored %s (%d saves, %d keys): the model has trained through pass %s",
            chain[-1].name,
            len(chain),
            chain[-1].table_keys,
            chain[-1].pass_id,
        )
    return chain[-1] if chain else None


def score(ctx: WorkerContext, pass_id: str, command_id: str) -> dict[str, Any]:
    """This worker's predictions for its files of ``pass_id`` with the model as it stands
    (inference only; unseen keys pull zeros, as in training), keyed by event id: the
    cluster's side of a training/serving skew check. The rows carry their event ids as
    Paddle instance ids (an in-memory dataset that parses them), and the dump writes them
    beside each prediction."""
    import paddle

    directory = pass_dir(ctx.cfg.paths.data_root, pass_id)
    files = [str(directory / p.file) for p in read_manifest(directory).parts]
    mine = files[ctx.rank :: ctx.workers]
    out = Path(ctx.cfg.paths.work_root) / "scores" / f"{pass_id}-{command_id}"
    dump = out / f"dump-{ctx.rank}"
    program = paddle.static.default_main_program()
    point_dump(program, [ctx.graph.predict.name], dump)
    try:
        if mine:
            command = pipe_command(ctx.cfg.feature_schema, ins_id=True)
            dataset = _in_memory_dataset(
                ctx, mine, _threads(ctx, mine), command, ins_id=True, scoring=True
            )
            try:
                ctx.exe.infer_from_dataset(program=program, dataset=dataset, debug=False)
            finally:
                dataset.release_memory()
    finally:
        point_dump(program, [], None)
    ids, (predictions,) = read_dump_with_ids(dump, 1)
    shutil.rmtree(dump)
    path = out / f"worker-{ctx.rank}.parquet"
    pq.write_table(
        pa.table(
            {
                "event_id": [unquote(i) for i in ids],
                "p_click": predictions.astype(np.float32),
            }
        ),
        path,
    )
    return {"pass_id": pass_id, "rank": ctx.rank, "rows": len(ids), "predictions": str(path)}


def done_in_model(ctx: WorkerContext, kind: str, pass_id: str) -> dict[str, Any] | None:
    """The stored result if the restored model already holds this command's effect: a
    pass at or before the newest save's pass, or a day whose daily save exists."""
    if not ctx.chain:
        return None
    newest = ctx.chain[-1]
    if kind == "train" and pass_id <= newest.pass_id:
        return {**(newest.train or {}), "pass_id": pass_id, "already_in_model": newest.name}
    if kind == "maintain" and any(
        i.kind == "daily" and i.pass_id >= pass_id
        for i in list_checkpoints(Path(ctx.cfg.paths.checkpoint_root))
    ):
        return {"pass_id": pass_id, "already_in_model": newest.name}
    return None


def _save_dense_inference_model(ctx: WorkerContext, prefix: Path) -> None:
    """Worker 0: the inference program (pooled embeddings + dense -> p) with the dense
    tables as the servers hold them once settled. ``fleet.save_inference_model`` would also
    make every server dump its whole sparse table, which the artifact takes from the
    checkpoints instead (only the keys a pass touched)."""
    import paddle

    dense_tables.settle()
    program = paddle.static.default_main_program()
    graph = ctx.graph
    block = program.global_block()
    feeds = [block.var(n) for n in graph.pooled.values()]
    if graph.dense_var:
        feeds.append(block.var(graph.dense_var))
    paddle.static.save_inference_model(
        str(prefix), feeds, [graph.predict], ctx.exe, program=program
    )


def export(ctx: WorkerContext, pass_id: str, command_id: str) -> dict[str, Any]:
    """The raw inference export of the model as trained through ``pass_id``: the dense
    program and its parameters, and the checkpoint chain that holds the sparse table (the
    artifact takes its embeddings from those saves)."""
    if not ctx.chain or ctx.chain[-1].pass_id != pass_id:
        raise ValueError(
            f"export of {pass_id} asked, but the model's newest save is after "
            f"{ctx.chain[-1].pass_id if ctx.chain else 'no pass'}: train {pass_id} first"
        )
    raw = Path(ctx.cfg.paths.work_root) / "exports" / f"{pass_id}-{command_id}"
    seconds: dict[str, float] = {}

    def write() -> None:
        tmp = temp_dir_for(raw)
        _save_dense_inference_model(ctx, tmp / EXPORT_MODEL_PREFIX)
        onnx = write_onnx_twin(tmp / EXPORT_MODEL_PREFIX)
        spec = ExportSpec(
            export_version=EXPORT_VERSION,
            pass_id=pass_id,
            model=ctx.cfg.model.model,
            model_prefix=EXPORT_MODEL_PREFIX,
            slot_feeds=ctx.graph.pooled,
            dense_feed=ctx.graph.dense_var,
            embedding_dim=ctx.cfg.model.hyper_parameters.sparse_feature_dim,
            saved_value_layout=saved_value_layout(ctx.cfg.model).to_dict(),
            feature_schema=ctx.cfg.feature_schema.model_dump(mode="json"),
            checkpoint_root=str(Path(ctx.cfg.paths.checkpoint_root)),
            chain=tuple(i.model_copy(update={"train": None}) for i in ctx.chain),
            trained_at=(ctx.chain[-1].train or {}).get("trained_at"),
            onnx=OnnxTwin(**onnx),
        )
        write_export_spec(tmp, spec)
        (tmp / "_SUCCESS").touch()
        publish_dir(tmp, raw)

    with ctx.stage("save", seconds):
        ctx.leader_only(write)
    return {"pass_id": pass_id, "raw_export": str(raw), "seconds": seconds}
