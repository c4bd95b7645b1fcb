"""The reference trainer for the benchmarks: Paddle's documented parameter-server example,
nothing of streamrec's runtime. fleetrun starts it as servers and workers; each worker
trains its share of plain-text files through ``QueueDataset`` with a
``MultiSlotDataGenerator`` pipe reader (bench/reference_reader.py) and
``train_from_dataset``, then writes its wall time to ``<out>/worker-<rank>.json``.

For bench/e2e.py's per-pass jobs it also does the documents' incremental steps: with
``--load`` the model saved by the previous pass is loaded (``fleet.load_model``, mode 0)
before training; with ``--save`` the whole model is saved after it
(``fleet.save_persistables``); with ``--export`` an inference model is written
(``fleet.save_inference_model``: the program from the slots' ids and the dense input to
the prediction, and every table).

The program is streamrec's (``build_distributed_program``: the model and the fleet
strategy from the same config), so both sides train the same model with the same strategy
and batch size; everything after it is Paddle's example.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from streamrec.config import load_config
from trainers.worker.strategy import build_distributed_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--files", required=True, help="comma-separated TSV files, all workers")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--load", type=Path, help="a model saved by --save, trained further")
    parser.add_argument("--save", type=Path, help="save the whole model here after training")
    parser.add_argument("--export", type=Path, help="write an inference model here")
    args = parser.parse_args()

    # paddle after pyarrow (imported with trainers.worker.strategy): the other order crashes in
    # pyarrow's zlib on import ("double free or corruption")
    from paddle.distributed import fleet

    cfg = load_config(args.config)
    graph = build_distributed_program(cfg)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return

    train_and_time(cfg, graph, args.files, args.out, args.load, args.save, args.export)


def train_and_time(
    cfg: Any,
    graph: Any,
    files: str,
    out: Path,
    load: Path | None = None,
    save: Path | None = None,
    export: Path | None = None,
) -> None:
    """Worker side: this worker's share of ``files`` through a ``QueueDataset`` with the
    reference reader and ``train_from_dataset``; its wall time to ``<out>/worker-<rank>.json``.
    ``load``, ``save`` and ``export`` as in ``main``."""
    import paddle
    from paddle.distributed import fleet

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    if load is not None:
        fleet.load_model(str(load), mode=0)
    mine = files.split(",")[fleet.worker_index() :: fleet.worker_num()]
    slots = ",".join(s.name for s in cfg.feature_schema.sparse)
    reader = Path(__file__).with_name("reference_reader.py")
    dataset = paddle.distributed.QueueDataset()
    dataset.init(
        use_var=graph.use_vars,
        pipe_command=f"{sys.executable} {reader} {slots}",
        batch_size=cfg.model.runner.batch_size,
        thread_num=cfg.model.runner.thread_num,
    )
    dataset.set_filelist(mine)
    fleet.util.barrier()
    start = time.perf_counter()
    if mine:
        exe.train_from_dataset(program=paddle.static.default_main_program(), dataset=dataset)
    seconds = time.perf_counter() - start
    fleet.util.barrier()
    if save is not None:
        fleet.save_persistables(exe, str(save), mode=0)
    if export is not None:
        feeds = [v.name for v in graph.use_vars[:-1]]  # all but the label
        fleet.save_inference_model(exe, str(export), feeds, [graph.predict])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"worker-{fleet.worker_index()}.json").write_text(json.dumps({"seconds": seconds}))
    fleet.stop_worker()


if __name__ == "__main__":
    main()
