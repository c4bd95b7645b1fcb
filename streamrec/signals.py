"""SIGTERM, what systemd, Kubernetes and compose send to stop a service, handled as Ctrl-C.

Python's default for SIGTERM ends the process at once, skipping every ``finally`` and
``except KeyboardInterrupt`` cleanup; a service that started a process group of its own
(``streamrec cluster`` starts fleetrun in one) would leave it running.
"""

from __future__ import annotations

import signal


def stop_on_sigterm() -> None:
    """Raise ``KeyboardInterrupt`` in the main thread on SIGTERM, as on Ctrl-C."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def ignore_stop_signals() -> None:
    """While shutting down: a second Ctrl-C or SIGTERM must not cut the cleanup short."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
