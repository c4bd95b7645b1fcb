"""The live local mode: the pipeline as it runs in production, on this machine, until Ctrl-C.

    streamrec demo --live [--rate 200]

Embedded broker and redis-server, a live synthetic stream timed now (1-minute passes), the
pass builder, the fleetrun cluster with its pass follower (``cluster.follow_passes``: it
trains, judges and delivers each pass as it completes), and Airflow's real api-server,
scheduler and dag-processor running ``dags/streamrec_pass.py``, one run watching each pass
(driving it, with the follower off). This process only prints the UI address and a status
table after each window.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from demo.services import on_local_services
from ops.airflow_local import LocalAirflow
from ops.pass_follower import following
from ops.status import format_table, recent_passes
from streaming.pass_builder import PassBuilder
from streaming.producer import produce_live
from streamrec.config import PipelineConfig, ScheduleConfig, derived, dump_config
from streamrec.passes import PassClock
from streamrec.signals import ignore_stop_signals
from trainers.launcher import LocalCluster

log = logging.getLogger("demo.live")
PASS_SECONDS = 60
# a local producer's events reach the builder within a second; a window waits this long
LATENESS_SECONDS = 5


def live_config(
    cfg: PipelineConfig, start: datetime, pass_seconds: int = PASS_SECONDS
) -> PipelineConfig:
    """``cfg`` made for a live stream of ``pass_seconds`` passes that Airflow schedules
    from the window holding ``start``: short lateness, label window and click delay."""

    return derived(
        cfg,
        "the live demo's config",
        passes={
            "pass_seconds": pass_seconds,
            "allowed_lateness_seconds": LATENESS_SECONDS,
            "idle_partition_seconds": 3,
        },
        join={"label_window_seconds": 10},
        synthetic={"click_delay_seconds": 3},
        schedule=ScheduleConfig(
            start=PassClock(pass_seconds).floor(start),
            poke_seconds=1,
            retry_delay_seconds=5,
            max_retry_delay_seconds=60,
        ),
    )


class LiveStack:
    """Everything the live mode runs; ``airflow`` can be stopped and started piecewise."""

    def __init__(self, cfg: PipelineConfig, rate: float, pass_seconds: int = PASS_SECONDS) -> None:
        self._exits = ExitStack()
        work = Path(cfg.paths.work_root)
        services = on_local_services(cfg, self._exits)
        self.cfg = live_config(services, datetime.now(UTC), pass_seconds)
        self.config_path = dump_config(self.cfg, work / "live.resolved.yaml")
        self.rate = rate
        self.stop_stream = threading.Event()
        self.airflow = LocalAirflow(work / "airflow", self.config_path)
        self.cluster = LocalCluster(self.cfg, self.config_path)

    def __enter__(self) -> LiveStack:
        try:
            self._start()
        except BaseException:
            self._exits.close()
            raise
        return self

    def _start(self) -> None:
        self._exits.enter_context(self.cluster)
        self._exits.enter_context(following(self.cfg, "local"))  # with cluster.follow_passes
        builder = PassBuilder(self.cfg)
        stop_builder = threading.Event()
        thread = threading.Thread(
            target=builder.run, kwargs={"stop": stop_builder}, name="pass-builder", daemon=True
        )
        thread.start()
        self._exits.callback(builder.close)
        self._exits.callback(thread.join, 30)
        self._exits.callback(stop_builder.set)
        self._exits.enter_context(self.airflow)
        producer = threading.Thread(
            target=produce_live,
            args=(self.cfg, self.rate, self.stop_stream),
            name="live-stream",
            daemon=True,
        )
        producer.start()
        self._exits.callback(producer.join, 30)
        self._exits.callback(self.stop_stream.set)

    def __exit__(self, *exc: object) -> None:
        self._exits.close()


def run_live(
    cfg: PipelineConfig,
    rate: float,
    duration_s: float | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run the live stack until ``stop`` is set (the entry frame sets it on Ctrl-C and
    SIGTERM) or ``duration_s`` has passed, printing status every window."""
    with LiveStack(cfg, rate) as stack:
        driver = (
            "the cluster trains each as it completes, a run of the DAG streamrec_pass watches it"
            if stack.cfg.cluster.follow_passes
            else "a run of the DAG streamrec_pass trains each"
        )
        print(
            f"\nAirflow UI: {stack.airflow.url}  (login: admin / {stack.airflow.password})\n"
            f"live stream: {rate:g} impressions/s, {PASS_SECONDS} s passes; {driver}. "
            f"Ctrl-C stops everything.\n"
            f"status any time: streamrec status --config {stack.config_path}\n",
            flush=True,
        )
        stopped = stop or threading.Event()
        if duration_s is not None:
            timer = threading.Timer(duration_s, stopped.set)
            timer.daemon = True
            timer.start()
        # sleeps, not stopped.wait(): the signal handler sets ``stopped``, and one that ran
        # while this thread held the event's lock inside wait() would never return; short
        # ones, because a signal the kernel hands to another thread runs its handler only
        # when this thread next wakes
        status_at = time.monotonic() + PASS_SECONDS
        while not stopped.is_set():
            time.sleep(1.0)
            if time.monotonic() >= status_at:
                print(format_table(recent_passes(stack.cfg, limit=10)) + "\n", flush=True)
                status_at += PASS_SECONDS
        ignore_stop_signals()  # a second Ctrl-C must not cut the shutdown short
        print("stopping: stream, Airflow, builder, cluster...", flush=True)
        stopping = time.monotonic()
    print(f"stopped in {time.monotonic() - stopping:.0f} s", flush=True)
    return 0
