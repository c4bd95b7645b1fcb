"""The reference trainer for bench/train.py: Paddle's documented parameter-server example,
nothing of streamrec's runtime. fleetrun starts it as servers and workers; each worker
trains its share of plain-text files through ``QueueDataset`` with a
``MultiSlotDataGenerator`` pipe reader (bench/reference_reader.py) and
``train_from_dataset``, then writes its wall time to ``<out>/worker-<rank>.json``.

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
from trainers.strategy import build_distributed_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--files", required=True, help="comma-separated TSV files, all workers")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    # paddle after pyarrow (imported with trainers.strategy): the other order crashes in
    # pyarrow's zlib on import ("double free or corruption")
    from paddle.distributed import fleet

    cfg = load_config(args.config)
    graph = build_distributed_program(cfg)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return

    train_and_time(cfg, graph, args.files, args.out)


def train_and_time(cfg: Any, graph: Any, files: str, out: Path) -> None:
    """Worker side: this worker's share of ``files`` through a ``QueueDataset`` with the
    reference reader and ``train_from_dataset``; its wall time to ``<out>/worker-<rank>.json``."""
    import paddle
    from paddle.distributed import fleet

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
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
    exe.train_from_dataset(program=paddle.static.default_main_program(), dataset=dataset)
    seconds = time.perf_counter() - start
    fleet.util.barrier()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"worker-{fleet.worker_index()}.json").write_text(json.dumps({"seconds": seconds}))
    fleet.stop_worker()


if __name__ == "__main__":
    main()
