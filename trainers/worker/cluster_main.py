"""Entry point of every cluster process; fleetrun starts it as servers and workers.

    fleetrun --servers ... --workers ... trainers/worker/cluster_main.py --config <resolved.yaml>

Servers build the program, then serve the tables until the workers leave. Workers build
the same program, restore the newest complete checkpoint chain into the servers, and loop on
the command stream until a ``stop`` command.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from streamrec.atomic_fs import remove_leftovers
from streamrec.config import admission_on, load_config
from streamrec.contracts.cluster import RestoreNote
from streamrec.logs import setup_logging
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import GENERATION_ENV, STARTED_ENV, Command, WorkerChannel
from trainers.leftovers import cluster_leftovers
from trainers.warm_start import model_signature
from trainers.worker import dense_average, exports, pass_steps, saves, sync_mode
from trainers.worker.devices import executor_place
from trainers.worker.scoring_program import op_types, scoring_program
from trainers.worker.server_flags import ADMISSION_FLAG, PUSH_FLAGS, preset_paddle_flags
from trainers.worker.strategy import build_distributed_program
from trainers.worker.worker_context import WorkerContext, agree_any

log = logging.getLogger("trainers.cluster")


def _execute(ctx: WorkerContext, command: Command) -> dict[str, Any]:
    """Run ``command``'s step; its reply's wire form (what the control plane stores)."""
    steps = {
        "train": pass_steps.train_pass,
        "maintain": saves.maintain,
        "export": exports.export,
        "score": pass_steps.score,
    }
    if command.kind == "train_steps":
        return pass_steps.train_steps(ctx, command.pass_id, command.steps).to_wire()
    step = steps.get(command.kind)
    return step(ctx, command.pass_id, command.id).to_wire() if step else {}


def serve_commands(ctx: WorkerContext, channel: WorkerChannel) -> None:
    """Run commands in stream order until ``stop``; every worker runs each one."""
    from paddle.distributed import fleet

    channel.set_state("idle")
    while True:
        command = channel.next_command()
        if command is None:
            continue
        if channel.stale_stop(command):
            log.warning("stop command %s was sent before this cluster started: skipped", command.id)
            if ctx.leader:
                channel.skip(command)
            fleet.util.barrier()  # nobody reads on before the cursor moved
            continue
        channel.set_state(f"{command.kind} {command.pass_id}".strip())
        result: dict | None = None
        error = None
        recorded = channel.is_done(command)
        in_model = saves.done_in_model(ctx, command.kind, command.pass_id)
        if agree_any(recorded or in_model is not None):
            # the done marker, or (after a crash between the save and the marker) the saves
            result = channel.stored_result(command) if recorded else {**(in_model or {})}
            result["already_done"] = True
            log.info(
                "%s %s already done; acknowledged without running", command.kind, command.pass_id
            )
        else:
            try:
                result = _execute(ctx, command)
            except Exception as e:  # reported to the caller through the command hash
                error = f"{type(e).__name__}: {e}"
                log.error("command %s failed: %s", command.id, traceback.format_exc())
            if agree_any(error is not None) and error is None:
                error = "failed on another worker"
        channel.acknowledge(command, None if error else result)
        fleet.util.barrier()
        if ctx.leader:  # the outcome and the cluster's cursor past the command, at once
            channel.record(command, None if error else result, error)
        fleet.util.barrier()  # nobody reads the next command before the cursor moved
        channel.set_state("idle")
        if command.kind == "stop":
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A streamrec parameter-server process.")
    parser.add_argument("--config", required=True, type=Path, help="resolved pipeline YAML")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = load_config(args.config)
    flags = dict(PUSH_FLAGS)
    if admission_on(cfg.feature_schema, cfg.model):
        flags[ADMISSION_FLAG] = "true"
    preset_paddle_flags(flags)

    import paddle
    from paddle.distributed import fleet

    place = executor_place(cfg.cluster.use_gpu)
    graph = build_distributed_program(cfg)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0

    exe = paddle.static.Executor(place)
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    rank = fleet.worker_index()
    channel = WorkerChannel(
        # its writes are idempotent (hset, set, a transaction of them): safe to retry
        connect(cfg.redis, ride_out_s=cfg.cluster.redis_outage_seconds),
        RedisKeys(cfg.name),
        rank,
        cfg.cluster.heartbeat_seconds,
        started_ms=int(os.environ.get(STARTED_ENV, "0")),
    )
    # before the sync round and the iterate sum join the training program: scoring has neither
    main = paddle.static.default_main_program()
    scoring = scoring_program(main)
    log.info(
        "scoring with %d of the training program's %d ops",
        *map(len, map(op_types, (scoring, main))),
    )
    workers = fleet.worker_num()
    signature = model_signature(cfg, main)
    ctx = WorkerContext(
        cfg, graph, exe, rank, workers, scoring, signature, report=channel.set_stage
    )
    if cfg.model.runner.sync_mode == "sync":
        ctx.sync = sync_mode.install(graph.loss)
    if cfg.model.runner.dense_average == "pass":  # after the sync round: its pull first
        ctx.average = dense_average.install(graph.loss)
    restoring = time.monotonic()
    restored = saves.restore(ctx)
    if ctx.leader:  # done markers past the restored model name work it no longer holds
        channel.note_restore(
            RestoreNote(
                generation=int(os.environ.get(GENERATION_ENV, "0")),
                checkpoint=restored.name if restored else None,
                saves=len(ctx.chain),
                seconds=time.monotonic() - restoring,
                at=time.time(),
            )
        )
        channel.forget_done_after(restored.pass_id if restored else "")
        grace_s = cfg.retention.leftover_minutes * 60
        for removed in remove_leftovers(cluster_leftovers(cfg.paths).leftovers, grace_s):
            log.info("removed a crashed writer's leftover %s: %s", removed.path, removed.why)
    fleet.util.barrier()
    channel.start_heartbeat()
    log.info("worker %d/%d ready", ctx.rank, ctx.workers)
    try:
        serve_commands(ctx, channel)
    finally:
        channel.stop_heartbeat()
    fleet.stop_worker()
    log.info("worker %d stopped", ctx.rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
