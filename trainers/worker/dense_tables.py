"""The dense tables as the servers hold them: pulled into a worker's scope, and settled.

A worker's scope holds the dense parameters its pull thread last fetched during training,
not what the servers hold after the pass: an export saved from the scope scored up to 0.2
away from the cluster. ``pull`` fetches them; ``settle`` pulls until two pulls agree, so a
save or an export never catches the servers mid-update; ``push`` writes parameters into
them. Fleet has no public dense-only pull or push: these are fleet's own
(``the_one_ps._pull_dense`` and ``_init_params``, Paddle 2.6.2), reached through its runtime.

Only training leaves updates in flight (the communicators send gradients on their own
threads); a push is synchronous (``PushDenseParamSync``). So once settled, the tables stay
settled until the next training read (``training_ran``): a pass's later settles (the refit's,
the save's, the export's) returned at once, where each waited two pulls and 0.05 s.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# whether this process has trained since its last settle (at start: unknown, so yes); the
# dense tables are fleet's, one per worker process
_trained_since_settle = True


def _fleet_tables() -> tuple[Any, Any, Any, Any, Any]:
    """Fleet's runtime, the program it registered its tables with, its scope and the
    program's send and receive contexts."""
    import paddle
    from paddle.distributed.fleet import fleet as fleet_instance
    from paddle.distributed.ps.utils.public import (
        get_the_one_recv_context,
        get_the_one_send_context,
    )

    runtime = fleet_instance._runtime_handle
    # the program fleet registered its tables with (the default main program has since
    # been rewritten, and a pull for any other program pulls nothing); one program, so
    # its scope is the global one
    program = runtime.origin_main_programs[0]
    scope = runtime.scopes[0]
    if scope is not paddle.static.global_scope():
        raise RuntimeError("fleet's scope is not the global scope the executor saves from")
    send = get_the_one_send_context(
        runtime.context, split_dense_table=runtime.is_heter_ps_mode, ep_list=runtime.endpoints
    )
    recv = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
    return runtime, program, scope, send, recv


def pull() -> dict[str, np.ndarray]:
    """Pull every dense table of the main program from the servers into the global scope;
    the pulled parameters by name."""
    runtime, program, scope, send, recv = _fleet_tables()
    names = runtime._pull_dense(program, scope, send, recv)
    if not names:
        raise RuntimeError("fleet pulled no dense table: the program has none registered")
    return {n: np.array(scope.find_var(n).get_tensor()) for n in names}


def push(values: dict[str, np.ndarray]) -> None:
    """Write ``values`` (every dense parameter of the main program, by name) into the
    global scope and the servers' dense tables: fleet's ``_init_params``, the push of
    parameters (not gradients) worker 0 makes at start. The optimizers' state stays."""
    import paddle

    runtime, program, scope, send, recv = _fleet_tables()
    expected = {
        n
        for c in send.values()
        if not c.is_sparse() and c.program_id() == id(program)
        for n in recv[c.table_id()]
    }
    if set(values) != expected:
        raise ValueError(f"dense values for {sorted(values)}, the tables hold {sorted(expected)}")
    for name, value in values.items():
        tensor = scope.find_var(name).get_tensor()
        tensor.set(value.astype(np.array(tensor).dtype), paddle.CPUPlace())
    runtime._init_params(program, scope, send, recv)


def digest() -> str:
    """sha256 of the dense parameters in this worker's scope, by name: equal digests on two
    workers mean they hold the same dense model."""
    _, _, scope, _, recv = _fleet_tables()
    sha = hashlib.sha256()
    for name in sorted(n for names in recv.values() for n in names):
        sha.update(name.encode())
        sha.update(np.array(scope.find_var(name).get_tensor()).tobytes())
    return sha.hexdigest()


def training_ran() -> None:
    """A training read ran in this process: the next ``settle`` waits for its updates."""
    global _trained_since_settle
    _trained_since_settle = True


def settle(interval_s: float = 0.05, timeout_s: float = 60.0) -> float:
    """Pull until two pulls ``interval_s`` apart are equal (the communicators' queues are
    drained); the seconds it took. Logs and returns after ``timeout_s`` if they never are.
    Returns 0 at once when no training ran here since the last settle."""
    global _trained_since_settle
    if not _trained_since_settle:
        return 0.0
    _trained_since_settle = False  # a timeout too: what is in flight then never lands
    started = time.monotonic()
    previous = pull()
    while time.monotonic() - started < timeout_s:
        time.sleep(interval_s)
        current = pull()
        if all(np.array_equal(previous[n], current[n]) for n in current):
            return time.monotonic() - started
        previous = current
    log.warning("dense tables still changing after %.0f s; saving them as they are", timeout_s)
    return time.monotonic() - started
