"""SIGTERM reaches Python's handler after Paddle is loaded: Paddle's first import installs
glog's failure handler for SIGTERM, which kills the process without its cleanup (or, under
load, deadlocks in it); ``streamrec.signals.handlers_kept`` keeps the process's own across
that import, from any thread. Each case runs in a fresh interpreter, where Paddle's first
import is the one that installs glog's handler."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

_CHILD = """
import os, signal, sys, threading, time
from streamrec.signals import handlers_kept, stop_on_sigterm

stop_on_sigterm()

def load():
    if sys.argv[1] == "kept":
        with handlers_kept():
            import paddle.inference
    else:
        import paddle.inference

thread = threading.Thread(target=load)  # as streamrec serve loads its first version
thread.start()
thread.join()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except KeyboardInterrupt:
    print("stopped by Python's handler")
    sys.exit(130)
"""


@pytest.mark.parametrize("kept", [True, False])
def test_sigterm_after_paddle_is_loaded_reaches_python(kept: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "kept" if kept else "bare"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if kept:
        assert done.returncode == 130, done.stderr[-2000:]
        assert "stopped by Python's handler" in done.stdout
    else:  # what serve did before: glog's handler ends it, no cleanup ran
        assert done.returncode == -signal.SIGTERM
        assert "Termination signal" in done.stdout + done.stderr
        assert "stopped by Python's handler" not in done.stdout
