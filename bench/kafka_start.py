"""What starting the project's Apache Kafka costs: seconds until it answers, CPU seconds
(its storage format and the broker's start), CPU over its first idle minute, and memory.

The shipped JVM settings (``devservices.kafka_broker``: serial GC, C1 only, the class-data
archive the install makes) against **the baseline**, the settings before them (G1 with
20 ms pauses and both compilers, no archive: ``KAFKA_JVM_PERFORMANCE_OPTS`` set to them),
same heap, in alternating rounds in the same run. A suite starts a few dozen brokers beside
busy trainers on two cores, so CPU is the figure that matters there.

    .venv/bin/python bench/kafka_start.py [--rounds 3] [--idle 60]

Ends with ``RESULT kafka_start_s``, ``kafka_start_cpu_s``, ``kafka_idle_cpu_s_per_min``,
``kafka_rss_mib`` (the shipped settings, medians) and the same names ending ``_baseline``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from devservices.kafka_broker import PERFORMANCE_ENV, install_kafka, start_kafka

BASELINE_OPTIONS = "-XX:+UseG1GC -XX:MaxGCPauseMillis=20"


@dataclass(frozen=True)
class Start:
    ready_s: float
    start_cpu_s: float
    idle_cpu_s_per_min: float
    rss_mib: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(idle_s: float) -> Start:
    """One broker: started, left idle for ``idle_s``, stopped."""
    with tempfile.TemporaryDirectory() as scratch:
        before = _children_cpu()
        started = time.monotonic()
        broker = start_kafka(Path(scratch))
        ready_s = time.monotonic() - started
        format_cpu = _children_cpu() - before  # the storage tool has exited by now
        process = psutil.Process(broker.process.pid)
        cpu = process.cpu_times()
        at_ready = cpu.user + cpu.system
        time.sleep(idle_s)
        cpu = process.cpu_times()
        idle = cpu.user + cpu.system - at_ready
        rss = process.memory_info().rss / 2**20
        broker.stop()
    return Start(ready_s, format_cpu + at_ready, idle * 60 / idle_s, rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=60.0, help="idle seconds measured")
    args = parser.parse_args()
    install_kafka()  # the class-data archive too
    runs: dict[str, list[Start]] = {"shipped": [], "baseline": []}
    for round_ in range(args.rounds):
        for name in ("baseline", "shipped"):
            if name == "baseline":
                os.environ[PERFORMANCE_ENV] = BASELINE_OPTIONS
            else:
                os.environ.pop(PERFORMANCE_ENV, None)
            start = measure(args.idle)
            runs[name].append(start)
            print(
                f"round {round_ + 1} {name:8s}: ready {start.ready_s:4.1f} s, start CPU "
                f"{start.start_cpu_s:4.1f} s, idle CPU {start.idle_cpu_s_per_min:4.1f} s/min, "
                f"RSS {start.rss_mib:4.0f} MiB",
                flush=True,
            )
    for name, starts in runs.items():
        suffix = "" if name == "shipped" else "_baseline"
        for field in ("ready_s", "start_cpu_s", "idle_cpu_s_per_min", "rss_mib"):
            value = statistics.median(getattr(s, field) for s in starts)
            label = {"ready_s": "kafka_start_s", "start_cpu_s": "kafka_start_cpu_s"}.get(
                field, f"kafka_{field}"
            )
            print(f"RESULT {label}{suffix} {value:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
