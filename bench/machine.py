"""The hardware line every benchmark prints."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def hardware_line() -> str:
    """Cores, CPU model, memory and Python version of this machine."""
    cpu_lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpu_lines if line.startswith("model name")),
        platform.processor(),
    )
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {cpu}, {mem:.0f} GiB, Python {platform.python_version()}"
