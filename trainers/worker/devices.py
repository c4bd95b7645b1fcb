"""Device choice for workers: CPU, or GPU where the installed Paddle wheel can serve it."""

from __future__ import annotations

import os
from typing import Any

from trainers.errors import DeviceUnsupported


def check_device(use_gpu: bool) -> None:
    """Fail with the wheel to install when ``use_gpu`` is set but Paddle lacks CUDA."""
    if not use_gpu:
        return
    import paddle

    if not paddle.is_compiled_with_cuda():
        raise DeviceUnsupported(
            f"cluster.use_gpu is true but the installed paddlepaddle {paddle.__version__} is a "
            "CPU-only build: install paddlepaddle-gpu==2.6.2 (with CUDA drivers) on the worker "
            "hosts, or set cluster.use_gpu: false"
        )
    if paddle.device.cuda.device_count() == 0:
        raise DeviceUnsupported("cluster.use_gpu is true but no CUDA device is visible to Paddle")


def executor_place(use_gpu: bool) -> Any:
    """The executor place of this worker (its local GPU, or the CPU)."""
    import paddle

    check_device(use_gpu)
    if use_gpu:
        selected = os.environ.get("FLAGS_selected_gpus", "0")  # noqa: SIM112 (Paddle's name)
        return paddle.CUDAPlace(int(selected.split(",")[0]))
    return paddle.CPUPlace()
