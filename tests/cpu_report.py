"""Where the suite's CPU goes: ``--cpu-report=DIR`` records, for every test, the CPU time of
the pytest process running it and of the child processes it reaped meanwhile, and the
controller prints the sum per module at the end (most first).

A child's time counts when it is reaped, so a module fixture's services count in the test
that stopped them, and processes that outlived their parent (re-parented to init, e.g.
after a SIGKILL of a cluster command) are not counted at all; session services count at
the end, in no module. Both cores of the CI machine are busy for most of the suite, so its
wall time follows this sum (tests/README.md)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


class CpuReport:
    """The plugin: one JSON line per test into ``<folder>/<worker>.jsonl``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.rows: list[dict[str, Any]] = []
        if self.worker is None:  # the controller, before any worker writes: this run only
            for old in folder.glob("*.jsonl"):
                old.unlink()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Any:
        (own, reaped), started = _cpu(), time.monotonic()
        yield
        own_after, reaped_after = _cpu()
        self.rows.append(
            {
                "module": item.nodeid.split("::", 1)[0],
                "own": own_after - own,
                "children": reaped_after - reaped,
                "wall": time.monotonic() - started,
            }
        )

    def pytest_sessionfinish(self) -> None:
        if self.rows:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{self.worker or 'main'}-{os.getpid()}.jsonl"
            path.write_text("".join(json.dumps(row) + "\n" for row in self.rows))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker is not None:
            return
        modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for path in self.folder.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                for i, key in enumerate(("own", "children", "wall")):
                    modules[row["module"]][i] += row[key]
        total = [sum(m[i] for m in modules.values()) for i in range(3)]
        write = terminalreporter.write_line
        terminalreporter.section(f"CPU per module (from {self.folder})")
        write(f"{'CPU-s':>8} {'own':>8} {'children':>8} {'wall s':>8}  module")
        for name, (own, children, wall) in sorted(modules.items(), key=lambda m: -sum(m[1][:2])):
            write(f"{own + children:8.1f} {own:8.1f} {children:8.1f} {wall:8.1f}  {name}")
        write(f"{total[0] + total[1]:8.1f} {total[0]:8.1f} {total[1]:8.1f} {total[2]:8.1f}  all")
