"""The ONNX twin of an exported program: written where the converter can convert it; where
it cannot (paddle2onnx aborts its process on an operator it does not know), the exporting
process lives on and the reason is returned, with no file left."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainers.worker.onnx_twin import write_onnx_twin

pytestmark = pytest.mark.timeout(300)


def _export(tmp_path: Path, body: Callable[[Any], Any]) -> Path:
    import paddle

    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 8], "float32")
            y = paddle.static.nn.fc(body(x), 1)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            prefix = tmp_path / "model"
            paddle.static.save_inference_model(str(prefix), [x], [y], exe, program=main)
    finally:
        paddle.disable_static()
    return prefix


def test_a_convertible_program_gets_its_twin(tmp_path: Path) -> None:
    import onnxruntime as ort

    prefix = _export(tmp_path, lambda x: x * 2.0)
    twin = write_onnx_twin(prefix)
    assert twin.file == "model.onnx" and (tmp_path / "model.onnx").is_file(), twin
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    out = session.run(None, {"x": np.ones((3, 8), np.float32)})[0]
    assert out.shape == (3, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model.onnx",
        "model.pdiparams",
        "model.pdmodel",
    ]


def test_an_operator_the_converter_lacks_leaves_the_paddle_program_alone(
    tmp_path: Path,
) -> None:
    import paddle

    prefix = _export(tmp_path, lambda x: paddle.logcumsumexp(x, axis=1))
    pid = os.getpid()
    twin = write_onnx_twin(prefix)
    assert os.getpid() == pid  # this process lives on: the converter aborted in a child
    assert twin.file is None and "logcumsumexp" in (twin.error or ""), twin
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pdiparams", "model.pdmodel"]
