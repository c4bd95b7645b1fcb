"""What a worker does for each command, on a typed context. Collectives live only here.

    train       infer on the pass (progressive validation) -> global metrics
                -> train on the pass -> global metrics; row count checked against the manifest
    checkpoint  fleet.save_persistables (servers write their tables) -> CHECKPOINT.json -> rename
    export      fleet.save_inference_model with the pooled embeddings as feeds (a dense program
                taking embeddings) + the sparse table -> export_spec.json -> _SUCCESS

Every worker calls every step: Paddle's saves run on worker 0 between barriers.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from streaming.pipe_reader import pipe_command
from streamrec.atomic_fs import publish_dir, write_text_atomic
from streamrec.config import PipelineConfig
from streamrec.passes import pass_dir, read_manifest
from trainers.metrics import STAT_NAMES, PassMetrics, metrics_from_stats
from trainers.models import ModelGraph
from trainers.strategy import saved_value_layout

log = logging.getLogger(__name__)

CHECKPOINT_MANIFEST = "CHECKPOINT.json"
EXPORT_SPEC = "export_spec.json"
EXPORT_VERSION = 1


@contextmanager
def timed(stage: str, into: dict[str, float]):
    """Record the wall time of ``stage`` (seconds) in ``into``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into[stage] = round(time.perf_counter() - start, 3)


@dataclass
class WorkerContext:
    """Everything a worker's steps need, built once at start."""

    cfg: PipelineConfig
    graph: ModelGraph
    exe: Any
    rank: int
    workers: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def _scope_array(name: str) -> np.ndarray:
    import paddle

    return np.array(paddle.static.global_scope().find_var(name).get_tensor())


def _reset_stats(ctx: WorkerContext) -> None:
    import paddle

    scope = paddle.static.global_scope()
    for var in ctx.graph.stat_vars.values():
        tensor = scope.find_var(var.name).get_tensor()
        tensor.set(np.zeros_like(np.array(tensor)), paddle.CPUPlace())


def _global_metrics(ctx: WorkerContext) -> PassMetrics:
    """Sum every worker's buckets and sums with fleet.metrics (gloo all-reduce), then
    compute the metrics once, in numpy."""
    from paddle.distributed import fleet

    stats = ctx.graph.stat_vars

    def summed(name: str) -> np.ndarray:
        return np.asarray(fleet.metrics.sum(_scope_array(stats[name].name).reshape(-1)))

    sums = {n: float(summed(n)[0]) for n in STAT_NAMES}
    return metrics_from_stats(summed("auc_pos"), summed("auc_neg"), sums)


def _threads(ctx: WorkerContext, files: list[str]) -> int:
    # QueueDataset aborts (glog CHECK) when a worker has fewer files than threads.
    return max(1, min(ctx.cfg.model.runner.thread_num, len(files)))


def _queue_dataset(ctx: WorkerContext, files: list[str], threads: int) -> Any:
    import paddle

    dataset = paddle.distributed.QueueDataset()
    dataset.init(
        use_var=ctx.graph.use_vars,
        pipe_command=pipe_command(ctx.cfg.feature_schema),
        batch_size=ctx.cfg.model.runner.batch_size,
        thread_num=threads,
    )
    dataset.set_filelist(files)
    return dataset


def _in_memory_dataset(ctx: WorkerContext, files: list[str], threads: int) -> Any:
    # paddle.distributed.InMemoryDataset().global_shuffle(fleet) raises AttributeError in
    # 2.6.2; the base DatasetFactory one shuffles across workers (DESIGN.md).
    from paddle.base import DatasetFactory

    dataset = DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(ctx.graph.use_vars)
    dataset.set_pipe_command(pipe_command(ctx.cfg.feature_schema))
    dataset.set_batch_size(ctx.cfg.model.runner.batch_size)
    dataset.set_thread(threads)
    dataset.set_filelist(files)
    dataset.load_into_memory()
    return dataset


def _run(ctx: WorkerContext, dataset: Any, train: bool) -> PassMetrics:
    import paddle

    _reset_stats(ctx)
    if dataset is not None:
        run = ctx.exe.train_from_dataset if train else ctx.exe.infer_from_dataset
        run(program=paddle.static.default_main_program(), dataset=dataset, debug=False)
    return _global_metrics(ctx)


def _test_then_train(
    ctx: WorkerContext, files: list[str], seconds: dict[str, float]
) -> tuple[PassMetrics, PassMetrics]:
    """Progressive validation, then training, on this worker's files of the pass.

    With more than one reader thread the metric accumulators (persistable variables the
    threads update without a lock) lose updates, and Paddle's per-thread merge
    (``stat_var_names``) doubled and lost counts when measured here; results then carry
    ``metrics_exact: false``. Changing the thread count between runs of one process aborts
    Paddle (a CHECK in dist_multi_trainer), so evaluation and training share it."""
    from paddle.distributed import fleet

    threads = _threads(ctx, files)
    if ctx.cfg.model.runner.reader_type == "QueueDataset":
        with timed("test", seconds):
            test = _run(ctx, _queue_dataset(ctx, files, threads) if files else None, train=False)
        with timed("train", seconds):
            train = _run(ctx, _queue_dataset(ctx, files, threads) if files else None, train=True)
        return test, train
    # InMemoryDataset: read the pass once, score it in file order, then shuffle it across
    # all workers (a collective: every worker takes part, with or without files) and train.
    with timed("load", seconds):
        dataset = _in_memory_dataset(ctx, files, threads)
    try:
        with timed("test", seconds):
            test = _run(ctx, dataset, train=False)
        with timed("shuffle", seconds):
            dataset.global_shuffle(fleet)
        with timed("train", seconds):
            train = _run(ctx, dataset, train=True)
    finally:
        dataset.release_memory()
    return test, train


def train_pass(ctx: WorkerContext, pass_id: str) -> dict[str, Any]:
    """Progressive validation on the pass, then training on it; global metrics of both."""
    directory = pass_dir(ctx.cfg.paths.data_root, pass_id)
    manifest = read_manifest(directory)
    files = [str(directory / p.file) for p in manifest.parts]
    mine = files[ctx.rank :: ctx.workers]
    seconds: dict[str, float] = {}
    test, train = _test_then_train(ctx, mine, seconds)
    if test.count != manifest.rows and ctx.cfg.model.runner.thread_num == 1:
        log.error(
            "pass %s: evaluated %d rows but the manifest has %d", pass_id, test.count, manifest.rows
        )
    return {
        "pass_id": pass_id,
        "rows": manifest.rows,
        "count_matches_manifest": test.count == manifest.rows,
        "test": test.to_dict(),
        "train": train.to_dict(),
        "seconds": seconds,
        "workers": ctx.workers,
        "reader": ctx.cfg.model.runner.reader_type,
        "metrics_exact": ctx.cfg.model.runner.thread_num == 1,
    }


def checkpoint(ctx: WorkerContext, pass_id: str, command_id: str) -> dict[str, Any]:
    """A full save of every table, published under ``<checkpoint_root>/<pass_id>``."""
    from paddle.distributed import fleet

    root = Path(ctx.cfg.paths.checkpoint_root)
    final = root / pass_id
    tmp = root / f".{pass_id}.tmp-{command_id}"
    seconds: dict[str, float] = {}
    with timed("save", seconds):
        fleet.save_persistables(ctx.exe, str(tmp), mode=0)
    if ctx.leader:
        manifest = read_manifest(pass_dir(ctx.cfg.paths.data_root, pass_id))
        info = {
            "pass_id": pass_id,
            "mode": 0,
            "kind": "full",
            "consumed_to": manifest.consumed_to,
            "resume_offsets": manifest.resume_offsets,
            "created_at": datetime.now(UTC).isoformat(),
        }
        write_text_atomic(tmp / CHECKPOINT_MANIFEST, json.dumps(info, indent=2))
        if final.exists():  # an earlier run of this command saved it; keep that one
            import shutil

            shutil.rmtree(tmp)
        else:
            publish_dir(tmp, final)
    fleet.util.barrier()
    return {"pass_id": pass_id, "path": str(final), "seconds": seconds}


def export(ctx: WorkerContext, pass_id: str, command_id: str) -> dict[str, Any]:
    """The raw inference export: dense program on embeddings, sparse table, spec."""
    from paddle.distributed import fleet

    raw = Path(ctx.cfg.paths.work_root) / "exports" / f"{pass_id}-{command_id}"
    graph = ctx.graph
    feeds = list(graph.pooled.values()) + ([graph.dense_var] if graph.dense_var else [])
    seconds: dict[str, float] = {}
    with timed("save", seconds):
        fleet.save_inference_model(ctx.exe, str(raw), feeds, [graph.predict], mode=0)
    if ctx.leader:
        schema = ctx.cfg.feature_schema
        spec = {
            "export_version": EXPORT_VERSION,
            "pass_id": pass_id,
            "model": ctx.cfg.model.model,
            "program_dir": "dnn_plugin",
            "sparse_dirs": sorted(p.name for p in raw.iterdir() if p.is_dir() and p.name.isdigit()),
            "slot_feeds": graph.pooled,
            "dense_feed": graph.dense_var,
            "embedding_dim": ctx.cfg.model.hyper_parameters.sparse_feature_dim,
            "saved_value_layout": saved_value_layout(ctx.cfg.model).to_dict(),
            "feature_schema": schema.model_dump(mode="json"),
        }
        write_text_atomic(raw / EXPORT_SPEC, json.dumps(spec, indent=2))
        (raw / "_SUCCESS").touch()
    fleet.util.barrier()
    return {"pass_id": pass_id, "raw_export": str(raw), "seconds": seconds}
