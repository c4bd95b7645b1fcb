"""The dense inference program as ONNX beside the Paddle one, written by the exporting
worker: Paddle is loaded there already, where a packaging process would pay its import
(0.7 s idle, 5.3 s measured under a 10,000 events/s stream) for a conversion of a few ms.

The converter runs in a forked child of the worker: for a program with an operator it
cannot convert, paddle2onnx 1.3.1 aborts its whole process ("Oops, there are some
operators not supported yet", then SIGABRT), which would take the worker and the export
with it. A child that fails, aborts or overruns leaves the artifact with the Paddle
program alone, and the spec says why.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from pathlib import Path

from trainers.export_spec import OnnxTwin

log = logging.getLogger(__name__)

ONNX_OPSET = 11
CONVERTER = "paddle2onnx==1.3.1"  # the last release for Paddle 2.x; 2.0 needs Paddle 3
_ERROR_CHARS = 500


def _convert(prefix: Path, target: Path) -> None:
    import paddle2onnx

    paddle2onnx.export(
        str(prefix.with_suffix(".pdmodel")),
        str(prefix.with_suffix(".pdiparams")),
        str(target),
        opset_version=ONNX_OPSET,
        verbose=False,
        enable_onnx_checker=True,
    )


def _in_child(prefix: Path, target: Path, output: Path) -> None:
    """The forked child: convert with its output in ``output``, then leave at once."""
    code = 1
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        _convert(prefix, target)
        code = 0 if target.is_file() else 1
    except BaseException:  # the child's exit status carries it; its text is in ``output``
        traceback.print_exc()
    finally:
        os._exit(code)


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's wait status, or None after killing it at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def write_onnx_twin(prefix: Path, timeout_s: float = 300) -> OnnxTwin:
    """Convert ``<prefix>.pdmodel``/``.pdiparams`` to ``<prefix>.onnx``; what was written,
    or why not (a program the converter cannot take keeps the Paddle format only)."""
    target = prefix.with_suffix(".onnx")
    output = prefix.with_suffix(".onnx.log")
    pid = os.fork()
    if pid == 0:
        _in_child(prefix, target, output)
    status = _wait(pid, timeout_s)
    text = output.read_text(errors="replace") if output.is_file() else ""
    output.unlink(missing_ok=True)
    if status is not None and os.waitstatus_to_exitcode(status) == 0:
        return OnnxTwin(file=target.name, opset=ONNX_OPSET, converter=CONVERTER)
    target.unlink(missing_ok=True)
    if status is None:
        why = f"the converter ran over {timeout_s:.0f} s"
    else:
        lines = [line for line in text.splitlines() if "Paddle2ONNX" in line or "rror" in line]
        code = os.waitstatus_to_exitcode(status)
        ended = f"signal {-code}" if code < 0 else f"exit {code}"
        why = f"the converter ended with {ended}: " + " | ".join(lines[-4:] or [text[-300:]])
    log.warning("no ONNX export of %s: %s", prefix, why)
    return OnnxTwin(file=None, error=why[:_ERROR_CHARS])
