"""The raw inference export after a pass (worker 0): the dense program with the dense
tables as the servers hold them, its ONNX twin, and ``export_spec.json`` naming the
checkpoint saves that hold the sparse tables (``trainers.export_spec``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrec.atomic_fs import publish_dir, temp_dir_for
from streamrec.config import sparse_tables
from streamrec.contracts.training import ExportReply
from streamrec.layout import Layout
from trainers.export_spec import (
    EXPORT_VERSION,
    ExportSpec,
    ExportTable,
    write_export_spec,
)
from trainers.network_loader import network_path
from trainers.worker import dense_tables
from trainers.worker.onnx_twin import write_onnx_twin
from trainers.worker.strategy import saved_value_layout, table_folder
from trainers.worker.worker_context import WorkerContext

EXPORT_MODEL_PREFIX = "model"


def _save_dense_inference_model(ctx: WorkerContext, prefix: Path) -> None:
    """Worker 0: the inference program (pooled embeddings, sequences with their masks,
    dense -> each task's probability, in the graph's task order) with the dense tables as
    the servers hold them once settled. ``fleet.save_inference_model`` would also
    make every server dump its whole sparse table, which the artifact takes from the
    checkpoints instead (only the keys a pass touched)."""
    import paddle

    dense_tables.settle()
    program = paddle.static.default_main_program()
    graph = ctx.graph
    block = program.global_block()
    names = [*graph.pooled.values(), *(n for pair in graph.sequences.values() for n in pair)]
    names += [graph.dense_var] if graph.dense_var else []
    # a network need not read every input (the dense features, a mask): Paddle refuses a
    # feed the prediction does not depend on, and serving feeds what the program asks for
    targets = [task.predict for task in graph.tasks.values()]
    feeds = [block.var(n) for n in _needed(block, [t.name for t in targets], names)]
    paddle.static.save_inference_model(str(prefix), feeds, targets, ctx.exe, program=program)


def _needed(block: Any, targets: list[str], names: list[str]) -> list[str]:
    """Those of ``names`` that any of ``targets`` is computed from, in their order."""
    needed = set(targets)
    for op in reversed(block.ops):
        if needed.intersection(op.output_arg_names):
            needed.update(op.input_arg_names)
    return [n for n in names if n in needed]


def _tables(ctx: WorkerContext) -> dict[str, ExportTable]:
    shapes = ctx.signature.sparse_tables
    return {
        name: ExportTable(
            folder=table_folder(shapes[name].table_id),
            dim=t.dim,
            saved_value_layout=saved_value_layout(t).to_dict(),
            slots=t.slots,
        )
        for name, t in sparse_tables(ctx.cfg.feature_schema, ctx.cfg.model).items()
    }


def export(ctx: WorkerContext, pass_id: str, command_id: str) -> ExportReply:
    """The raw inference export of the model as trained through ``pass_id``: the dense
    program and its parameters, and the checkpoint chain that holds the sparse table (the
    artifact takes its embeddings from those saves)."""
    if not ctx.chain or ctx.chain[-1].pass_id != pass_id:
        raise ValueError(
            f"export of {pass_id} asked, but the model's newest save is after "
            f"{ctx.chain[-1].pass_id if ctx.chain else 'no pass'}: train {pass_id} first"
        )
    raw = Layout.of(ctx.cfg.paths).export_dir(pass_id, command_id)
    seconds: dict[str, float] = {}

    def write() -> None:
        tmp = temp_dir_for(raw)
        _save_dense_inference_model(ctx, tmp / EXPORT_MODEL_PREFIX)
        onnx = write_onnx_twin(tmp / EXPORT_MODEL_PREFIX)
        spec = ExportSpec(
            export_version=EXPORT_VERSION,
            pass_id=pass_id,
            model=ctx.cfg.model.model,
            network=network_path(ctx.cfg.model),
            model_prefix=EXPORT_MODEL_PREFIX,
            slot_feeds=ctx.graph.pooled,
            sequence_feeds=ctx.graph.sequences,
            dense_feed=ctx.graph.dense_var,
            outputs=tuple(ctx.graph.tasks),
            sparse_tables=_tables(ctx),
            feature_schema=ctx.cfg.feature_schema.model_dump(mode="json"),
            checkpoint_root=str(Path(ctx.cfg.paths.checkpoint_root)),
            chain=tuple(i.model_copy(update={"train": None}) for i in ctx.chain),
            trained_at=(ctx.chain[-1].train or {}).get("trained_at"),
            onnx=onnx,
        )
        write_export_spec(tmp, spec)
        (tmp / "_SUCCESS").touch()
        publish_dir(tmp, raw)

    with ctx.stage("save", seconds):
        ctx.leader_only(write)
    return ExportReply(pass_id=pass_id, raw_export=str(raw), seconds=seconds)
