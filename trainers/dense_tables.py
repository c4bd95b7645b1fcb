"""The dense tables as the servers hold them: pulled into a worker's scope, and settled.

A worker's scope holds the dense parameters its pull thread last fetched during training,
not what the servers hold after the pass: an export saved from the scope scored up to 0.2
away from the cluster. ``pull`` fetches them; ``settle`` pulls until two pulls agree, so a
save or an export never catches the servers mid-update. Fleet has no public dense-only pull:
this is fleet's own (``the_one_ps._pull_dense``, Paddle 2.6.2), reached through its runtime.
"""

from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger(__name__)


def pull() -> dict[str, np.ndarray]:
    """Pull every dense table of the main program from the servers into the global scope;
    the pulled parameters by name."""
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
    names = runtime._pull_dense(
        program,
        scope,
        get_the_one_send_context(
            runtime.context, split_dense_table=runtime.is_heter_ps_mode, ep_list=runtime.endpoints
        ),
        get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode),
    )
    if not names:
        raise RuntimeError("fleet pulled no dense table: the program has none registered")
    return {n: np.array(scope.find_var(n).get_tensor()) for n in names}


def settle(interval_s: float = 0.05, timeout_s: float = 60.0) -> float:
    """Pull until two pulls ``interval_s`` apart are equal (the communicators' queues are
    drained); the seconds it took. Logs and returns after ``timeout_s`` if they never are."""
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
