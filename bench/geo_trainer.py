"""GEO against async for bench/train.py, on the model GEO can run: fleetrun starts it as
servers and workers; each worker trains its share of the TSV files like the reference
trainer and writes its wall time to ``<out>/worker-<rank>.json``.

GEO in Paddle 2.6.2 keeps a full copy of every embedding on each worker, so it cannot use
``sparse_embedding``'s table of 64-bit feature signs (docs/decisions/). Here each slot's
signs are folded into ``--buckets`` rows of an ``embedding(is_sparse=True)`` instead, the
rest of the model (streamrec's, from the config) unchanged, and the same program trains
in ``--mode geo`` (``k_steps``) or ``--mode async``: the ratio of the two is GEO's gain on
equal terms. Nothing here checkpoints: a GEO sparse table's save is a no-op in 2.6.2.
"""

import argparse
from pathlib import Path

from reference_trainer import train_and_time

from streamrec.config import load_config
from trainers.models import build_model


def _bucketed_embedding(paddle, buckets: int):
    """A stand-in for ``sparse_embedding``: signs modulo ``buckets`` into a dense-backed
    embedding that GEO's communicator can hold."""

    def embedding(input, size, param_attr=None, **_):  # Paddle's argument names
        ids = paddle.remainder(input, paddle.full([1], buckets, dtype="int64"))
        rows = paddle.static.nn.embedding(
            input=ids, size=[buckets, size[1]], is_sparse=True, param_attr=param_attr
        )
        return paddle.reshape(rows, [-1, size[1]])  # [n, 1, d] -> [n, d], LoD kept

    return embedding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--files", required=True, help="comma-separated TSV files, all workers")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mode", choices=["geo", "async"], required=True)
    parser.add_argument("--buckets", type=int, default=1 << 18)
    parser.add_argument("--k-steps", type=int, default=100, help="GEO: batches per exchange")
    args = parser.parse_args()

    import paddle
    from paddle.distributed import fleet

    cfg = load_config(args.config)
    paddle.enable_static()
    fleet.init(is_collective=False)
    paddle.static.nn.sparse_embedding = _bucketed_embedding(paddle, args.buckets)
    graph = build_model(cfg.feature_schema, cfg.model)
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    if args.mode == "geo":
        strategy.a_sync_configs = {"k_steps": args.k_steps}
    opt = cfg.model.hyper_parameters.optimizer
    # lazy Adam: only the rows a batch looked up move (a full-table Adam step per batch
    # would dominate GEO's time)
    optimizer = paddle.optimizer.Adam(learning_rate=opt.learning_rate, lazy_mode=True)
    fleet.distributed_optimizer(optimizer, strategy).minimize(graph.loss)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return

    train_and_time(cfg, graph, args.files, args.out)


if __name__ == "__main__":
    main()
