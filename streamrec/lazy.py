"""Lazy package exports (PEP 562): a package names its public symbols and the module each
lives in; a symbol's module is imported on first use. Importing one module of a package
(as the pipe reader process or a DAG file does) then does not import the whole stage."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``__all__`` and a module ``__getattr__`` serving ``exports`` (name -> module)."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(exports), __getattr__
