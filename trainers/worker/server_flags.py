"""Paddle flags that Paddle 2.6 reads only from its own command line.

Paddle parses gflags once, at import, and takes from the environment only the flags it
exports to Python; the parameter-server flags (such as
``pserver_enable_create_feasign_randomly``, which turns on probabilistic admission of new
sparse keys) are not among them. Loading Paddle's core library first and parsing the flags
ourselves, with the same ``--tryfromenv`` list Paddle would use, sets them; Paddle's own
parse then does nothing (it runs once per process).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from trainers.errors import TrainerError

ADMISSION_FLAG = "pserver_enable_create_feasign_randomly"
# Worker flags for every update mode. Paddle's client holds gradient pushes back until more
# than a merge limit are queued (12 by default) or its poll comes round (10 ms for sparse
# ones), and then sends their sum as one update.
# - Dense: with a few batches a worker per pass the servers saw a pass's dense gradients
#   only after it, all at once, computed on parameters a whole pass old: on real Criteo
#   rows the output level swung by a factor of 9 from pass to pass and AUC lagged
#   (docs/decisions/, "Dense pushes are sent unmerged"). Sync mode needs the same: its
#   ``client_flush`` alternative sleeps 100 ms a call and hung after ~1000 rounds.
# - Sparse: up to 12 batches' gradients applied as one AdaGrad step, in a grouping the
#   timing chose, were the largest source of run-to-run spread and cost 0.003-0.005 AUC
#   against the regression on KDD; at 512-row batches sending each costs nothing
#   measurable (docs/decisions/, "A steady model").
# Sent one by one from a 1 ms loop, each batch's gradient reaches the servers while the
# next batch runs.
PUSH_FLAGS = {
    "pserver_push_dense_merge_limit": "0",
    "pserver_async_push_dense_interval_ms": "1",
    "pserver_push_sparse_merge_limit": "0",
    "pserver_async_push_sparse_interval_ms": "1",
}


def preset_paddle_flags(flags: dict[str, str]) -> None:
    """Set ``flags`` (name without ``FLAGS_`` -> value) before Paddle is imported."""
    if not flags:
        return
    if "paddle" in sys.modules:
        raise TrainerError(f"Paddle flags {sorted(flags)} must be set before paddle is imported")
    spec = importlib.util.find_spec("paddle")
    if spec is None or spec.origin is None:
        raise TrainerError("paddlepaddle is not installed in this environment")
    lib_path = Path(spec.origin).parent / "base" / "libpaddle.so"
    lib_spec = importlib.util.spec_from_file_location("paddle.base.libpaddle", lib_path)
    if lib_spec is None or lib_spec.loader is None:
        raise TrainerError(f"cannot load Paddle's core library {lib_path}")
    lib = importlib.util.module_from_spec(lib_spec)
    lib_spec.loader.exec_module(lib)
    names = lib.globals().keys()  # a pybind registry: keys() is how to list it
    exported = [k.removeprefix("FLAGS_") for k in names if k.startswith("FLAGS_")]
    args = [f"--tryfromenv={','.join(exported)}"] + [f"--{k}={v}" for k, v in flags.items()]
    if not lib.init_gflags(args):
        raise TrainerError("Paddle's flags were parsed already; set them earlier")
    sys.modules["paddle.base.libpaddle"] = lib  # Paddle's import reuses the loaded library
