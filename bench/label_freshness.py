"""Freshness of passes whose rows wait an hour for their conversions, against a click-only
pipeline on the same live stream, in the same run.

    .venv/bin/python bench/label_freshness.py [--minutes 75] [--rate 100]

One live producer (``streamrec produce --live``'s loop on ``examples/conversions``:
impressions timed now, each click when it happens, each conversion when it happens) feeds
two pass builders, each in its own consumer group and data root, on one local broker:

- the baseline, click-only: one label, the click joined within 10 minutes;
- the two-label pipeline: the click as above and the conversion within one hour.

A pass's freshness is when its manifest was written less its window's end. The two-label
pipeline holds each row until its longest window has closed (docs/DECISIONS.md, "Several
labels"), so its freshness is about the hour longer; the figure says what it is, measured.
Prints every pass of both, then ``RESULT label_freshness_s <median, two labels>`` and
``RESULT label_freshness_s_baseline <median, click only>``, and the rows each held waiting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from machine import hardware_line

from streaming.pass_builder import PassBuilder
from streaming.producer import produce_live
from streamrec.config import PipelineConfig, derived, load_config, with_services
from streamrec.kafka_broker import start_kafka
from streamrec.passes import complete_passes, pass_dir, read_manifest, window_ms

REPO = Path(__file__).resolve().parent.parent
PASS_MINUTES = 5


def _configs(root: Path, servers: str) -> tuple[PipelineConfig, PipelineConfig]:
    example = load_config(REPO / "examples/conversions/pipeline.yaml")
    base = with_services(example, servers, "redis://unused")  # builders need no Redis
    fs = base.feature_schema.model_dump(mode="json")
    click = fs["labels"][0]
    two = derived(
        base,
        "two labels",
        passes={"pass_minutes": PASS_MINUTES},
        paths={"data_root": root / "two"},
        kafka={"consumer_group": "two-labels"},
    )
    one = derived(
        two,
        "click only",
        schema={**fs, "labels": [click]},
        paths={"data_root": root / "one"},
        kafka={"consumer_group": "click-only"},
    )
    return one, two


def _build(cfg: PipelineConfig, stop: threading.Event) -> None:
    builder = PassBuilder(cfg)
    try:
        builder.run(stop=stop)
    finally:
        builder.close()


def _freshness(cfg: PipelineConfig) -> list[tuple[str, float, int, int]]:
    """(pass id, freshness s, rows, rows waiting) of each complete pass."""
    out = []
    for pass_id in complete_passes(cfg.paths.data_root):
        m = read_manifest(pass_dir(cfg.paths.data_root, pass_id))
        written = datetime.fromisoformat(m.created_at).timestamp()
        end = window_ms(pass_id, PASS_MINUTES)[1] / 1000
        out.append((pass_id, written - end, m.rows, m.counts.waiting))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=75, help="how long the stream runs")
    parser.add_argument("--rate", type=float, default=100, help="impressions per second")
    args = parser.parse_args()
    print(hardware_line())
    with tempfile.TemporaryDirectory(prefix="label-freshness-") as tmp:
        root = Path(tmp)
        broker = start_kafka(root / "services")
        try:
            one, two = _configs(root, broker.address)
            stop = threading.Event()
            threads = [
                threading.Thread(target=produce_live, args=(two, args.rate, stop), daemon=True),
                threading.Thread(target=_build, args=(one, stop), daemon=True),
                threading.Thread(target=_build, args=(two, stop), daemon=True),
            ]
            threads[0].start()
            time.sleep(5)  # the producer makes the topics
            for t in threads[1:]:
                t.start()
            stop.wait(args.minutes * 60)
            stop.set()
            for t in threads:
                t.join(timeout=120)
            medians = {}
            for name, cfg in (("click only", one), ("two labels", two)):
                rows = _freshness(cfg)
                print(f"{name}: {len(rows)} passes")
                for pass_id, fresh, n, waiting in rows:
                    print(
                        f"  {pass_id}  freshness {fresh:7.1f} s  rows {n:7d}  waiting {waiting:7d}"
                    )
                medians[name] = (
                    statistics.median(f for _, f, _, _ in rows) if rows else float("nan")
                )
        finally:
            broker.stop()
    print(f"RESULT label_freshness_s {medians['two labels']:.1f}")
    print(f"RESULT label_freshness_s_baseline {medians['click only']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
