"""SIGTERM, what systemd, Kubernetes and compose send to stop a service, handled as Ctrl-C.

Python's default for SIGTERM ends the process at once, skipping every ``finally`` and
``except KeyboardInterrupt`` cleanup; a service that started a process group of its own
(``streamrec cluster`` starts fleetrun in one) would leave it running.
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Iterator
from contextlib import contextmanager


def stop_on_sigterm() -> None:
    """Raise ``KeyboardInterrupt`` in the main thread on SIGTERM, as on Ctrl-C."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def ignore_stop_signals() -> None:
    """While shutting down: a second Ctrl-C or SIGTERM must not cut the cleanup short."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def handlers_kept() -> Iterator[None]:
    """Keep the process's SIGTERM and SIGINT handlers across a block that loads a native
    library which installs its own. Paddle's first import installs glog's failure handler
    for SIGTERM: it prints a C++ "FatalError" and kills the process at once, skipping every
    cleanup, and, when the signal lands while the interrupted thread holds malloc's lock
    (a service under load), deadlocks in the handler with SIGTERM blocked, for ever. Works
    on any thread (``signal.signal`` works on the main thread only)."""
    # the C-level handlers, as Python's own signal module reads and sets them
    getsig, setsig = ctypes.pythonapi.PyOS_getsig, ctypes.pythonapi.PyOS_setsig
    getsig.restype, getsig.argtypes = ctypes.c_void_p, [ctypes.c_int]
    setsig.restype, setsig.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p]
    saved = {sig: getsig(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if getsig(sig) != handler:
                setsig(sig, handler)
