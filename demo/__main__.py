"""Run the whole streamrec loop on this machine and print a per-pass table.

    streamrec demo [--config configs/pipeline.yaml] [--passes 4]
    streamrec demo --live [--rate 200]     Airflow schedules a live stream, until Ctrl-C

generator -> Kafka -> pass builder -> PS cluster (progressive AUC, training, checkpoint)
-> quality gate -> artifact -> serving pointer -> a prediction from the served model; each
pass through ``ops.pass_sequence.run_pass``, the steps the Airflow DAG runs as tasks.
With ``embedded`` services in the config, a broker and a redis-server start on loopback and
the config's data, checkpoint and model directories are emptied first (the embedded broker
keeps nothing between runs, so earlier passes could not be resumed).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from demo.services import on_local_services
from ops.pass_sequence import run_pass
from serving_export import delivery
from serving_export.predictor import Predictor
from streaming.events import scoring_row
from streaming.pass_builder import PassBuilder
from streaming.producer import best_auc, produce_synthetic
from streamrec.config import PipelineConfig, dump_config, load_config
from streamrec.entry import run_command
from streamrec.errors import StreamrecError
from streamrec.passes import is_complete, pass_dir
from streamrec.waiting import poll_until
from trainers.launcher import LocalCluster

log = logging.getLogger("demo")
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "pipeline.yaml"


def _wait_for_pass(cfg: PipelineConfig, pass_id: str, timeout_s: float = 300) -> None:
    directory = pass_dir(cfg.paths.data_root, pass_id)
    if poll_until(lambda: is_complete(directory) or None, timeout_s, 0.2) is None:
        raise StreamrecError(f"pass {pass_id} did not appear within {timeout_s:.0f}s")


def run_demo(cfg: PipelineConfig, passes: int, first_pass: str) -> list[dict]:
    """Produce, build, train, gate and deliver ``passes`` passes; one row per pass."""
    work = Path(cfg.paths.work_root)
    with ExitStack() as stack:
        cfg = on_local_services(cfg, stack)
        resolved = dump_config(cfg, work / "pipeline.resolved.yaml")

        batches = produce_synthetic(cfg, first_pass, passes)
        log.info("produced %d events", sum(len(b.events) for b in batches.values()))

        builder = PassBuilder(cfg)
        stop = threading.Event()
        thread = threading.Thread(
            target=builder.run, kwargs={"stop": stop}, name="pass-builder", daemon=True
        )
        thread.start()
        stack.callback(builder.close)
        stack.callback(thread.join)
        stack.callback(stop.set)

        cluster = stack.enter_context(LocalCluster(cfg, resolved))
        rows = []
        for pass_id in list(batches)[:passes]:
            start = time.monotonic()
            _wait_for_pass(cfg, pass_id)
            done = run_pass(cfg, cluster.client, pass_id)
            trained, save = done.train, done.train.checkpoint
            b = batches[pass_id]
            best = b.best_task_aucs(cfg.labels)
            tasks = {  # a multi-task model's further tasks, each beside its best AUC
                column: value
                for name, task in trained.tasks.items()
                for column, value in (
                    (f"AUC {name}", task.test.auc),
                    (f"best {name}", best.get(name)),
                )
            }
            rows.append(
                {
                    "pass": pass_id,
                    "rows": trained.rows,
                    "table keys": save.table_keys if save else "",
                    "save": save.kind if save else f"in {trained.already_in_model}",
                    "AUC": trained.test.auc,
                    "best AUC": best_auc(cfg, b),
                    "train AUC": trained.train.auc,
                    "logloss": trained.test.logloss,
                    "COPC": trained.test.copc,
                    "gate": "pass" if done.decision.passed else "reject",
                    "delivered": done.version or "",
                    "seconds": time.monotonic() - start,
                    **tasks,
                }
            )

        predictor = Predictor.serving(cfg.paths.model_root, delivery.registry_for(cfg))
        tail = list(batches.values())[-1].events[:5]
        scores = predictor.score_tasks([scoring_row(e, predictor.schema) for e in tail])
        print(f"\nserving model {predictor.version} scores the next events:")
        for i, event in enumerate(tail):
            said = "  ".join(
                f"p({task})={scores[k, i]:.4f}  {task}={event[_column_of(cfg)[task]]}"
                for k, task in enumerate(predictor.tasks)
            )
            print(f"  {event['event_id']:<16} {said}")
        print(
            f"\npasses, slices, checkpoints and models are under {Path(cfg.paths.data_root).parent}"
        )
    return rows


def _column_of(cfg: PipelineConfig) -> dict[str, str]:
    """Each label's field in a synthetic event, by the label's name."""
    schema = cfg.feature_schema
    return {x.name: c for x, c in zip(schema.labels, schema.label_columns, strict=True)}


_COLUMNS = [  # (title = row key, width, format)
    ("pass", 13, "{}"),
    ("rows", 7, "{}"),
    ("table keys", 10, "{}"),
    ("save", 6, "{}"),
    ("AUC", 8, "{:.4f}"),
    ("best AUC", 9, "{:.4f}"),
    ("train AUC", 10, "{:.4f}"),
    ("logloss", 8, "{:.4f}"),
    ("COPC", 6, "{:.3f}"),
    ("gate", 7, "{}"),
    ("delivered", 13, "{}"),
    ("seconds", 8, "{:.1f}"),
]


def print_table(rows: list[dict]) -> None:
    """The per-pass table: progressive AUC next to the stream's best reachable AUC (a
    multi-task model's further tasks: theirs after the main task's)."""
    known = {title for title, _, _ in _COLUMNS}
    tasks = list(dict.fromkeys(k for r in rows for k in r if k not in known))
    at = [title for title, _, _ in _COLUMNS].index("train AUC")
    columns = [*_COLUMNS[:at], *((t, max(9, len(t) + 1), "{:.4f}") for t in tasks), *_COLUMNS[at:]]
    header = " ".join(f"{title:>{width}}" for title, width, _ in columns)
    print("\nprogressive validation per pass (AUC measured before training on the pass):")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            " ".join(
                f"{fmt.format(r[title]) if r.get(title) not in ('', None) else '-':>{width}}"
                for title, width, fmt in columns
            )
        )


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the CLI reference is generated from them)."""
    parser = argparse.ArgumentParser(
        prog="streamrec demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="pipeline YAML")
    parser.add_argument("--passes", type=int, default=4, help="passes to train (at least 1)")
    parser.add_argument("--first-pass", default="202601010000", help="pass id of the first window")
    parser.add_argument(
        "--live",
        action="store_true",
        help="run the real Airflow scheduler on a live stream of 1-minute passes until Ctrl-C",
    )
    parser.add_argument("--rate", type=float, default=300, help="--live: impressions/s")
    parser.add_argument("--duration", type=float, help="--live: stop after this many seconds")
    return parser


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.live:
        # Ctrl-C and SIGTERM set ``stop``: no KeyboardInterrupt lands inside a client call
        stop = threading.Event()
        return run_command(lambda: _live(args, stop), stop=stop)
    return run_command(lambda: _demo(args))


def _live(args: argparse.Namespace, stop: threading.Event) -> int:
    from demo.live import run_live

    return run_live(load_config(args.config), args.rate, args.duration, stop)


def _demo(args: argparse.Namespace) -> int:
    print_table(run_demo(load_config(args.config), max(1, args.passes), args.first_pass))
    return 0


if __name__ == "__main__":
    sys.exit(main())
