"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def static_program() -> Iterator[Any]:
    """A fresh Paddle static program, current for the test's build; dynamic mode after."""
    import paddle

    main, startup = paddle.static.Program(), paddle.static.Program()
    paddle.enable_static()
    try:
        with paddle.static.program_guard(main, startup):
            yield main
    finally:
        paddle.disable_static()
