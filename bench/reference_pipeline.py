"""The doc-style reference pipeline for bench/e2e.py, built only from what Paddle's
parameter-server documents show. A Kafka consumer appends each impression to a text file of
its event-time window (one per partition, so with as many partitions as workers each
worker gets a file); once the wall clock passes a window's end plus the config's allowed
lateness the window is closed (later events for it are dropped and counted) and a fresh
fleetrun job trains it: it loads the model the previous pass saved, trains with
``train_from_dataset``, saves the whole model and exports an inference model
(bench/reference_trainer.py). Jobs run one at a time, in window order,
as a cron job per window would.

With the click joined from its own topic (``schema.labels``: source topic, as bench/e2e.py's
``--join click_join`` sets it), the consumer reads the clicks too and holds each window's
impressions until the window's end plus the label's window plus the lateness: then each is
labelled by whether its click came within the label's window, and written. This is the
usual join before training (PaddleRec's online trainers take joined logs); a later click
is lost.

    python bench/reference_pipeline.py --config C --root DIR --first PASS_ID --passes N

Writes one JSON line per pass to ``<root>/passes.jsonl``: the pass, its rows, the job's
start and end (epoch seconds), its ``train_from_dataset`` seconds and its positives; at
the end, the
events dropped as late (per window) or malformed to ``<root>/dropped.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from kafka import KafkaConsumer
from pipeline import fleet_job, tsv_line

from streaming.kafka_clients import client_settings
from streamrec.config import PipelineConfig, derived, load_config
from streamrec.logs import setup_logging
from streamrec.signals import stop_on_sigterm

log = logging.getLogger("bench.reference")


class WindowFiles:
    """Impressions appended to ``<root>/data/<window>/part-<partition>.tsv`` by event time
    (with a joined click: held until the window closes, then labelled and written); a
    closed window takes no more (its late events are counted)."""

    def __init__(self, cfg: PipelineConfig, root: Path, first: str) -> None:
        self._cfg, self._root, self._first = cfg, root, first
        self._open: dict[tuple[str, int], TextIO] = {}
        self._closed: set[str] = set()
        self._lock = threading.Lock()
        click = next((x for x in cfg.topic_labels if x.name == "click"), None)
        self._click_ms = None if click is None else (click.window_seconds or 0) * 1000
        # window -> (partition, event id, event time, row) held for the click join
        self._held: dict[str, list[tuple[int, str, int, dict[str, Any]]]] = {}
        self._clicks: dict[str, int] = {}  # event id -> its click's time
        self.rows: dict[str, int] = {}
        self.positives: dict[str, int] = {}
        self.late: dict[str, int] = {}
        self.malformed = 0

    def add(self, partition: int, value: bytes) -> None:
        try:
            event = json.loads(value)
            window = self._cfg.passes.clock.id_at(event["event_time"])
        except (ValueError, KeyError, TypeError):
            self.malformed += 1
            return
        if window < self._first:
            return
        schema = self._cfg.feature_schema
        row = {
            "label": event.get("label", 0),
            **{s.name: event["sparse"].get(s.name, s.default) for s in schema.sparse},
            **{d.name: event["dense"].get(d.name, d.default) for d in schema.dense},
        }
        with self._lock:
            if window in self._closed:
                self.late[window] = self.late.get(window, 0) + 1
                return
            self.rows[window] = self.rows.get(window, 0) + 1
            if self._click_ms is None:
                self._write(window, partition, row)
            else:
                held = (partition, event["event_id"], event["event_time"], row)
                self._held.setdefault(window, []).append(held)

    def add_click(self, value: bytes) -> None:
        """A click event: its impression's label, when that impression's window closes."""
        try:
            event = json.loads(value)
            self._clicks[event["event_id"]] = int(event["click_time"])
        except (ValueError, KeyError, TypeError):
            self.malformed += 1

    def _write(self, window: str, partition: int, row: dict[str, Any]) -> None:
        f = self._open.get((window, partition))
        if f is None:
            path = self._root / "data" / window / f"part-{partition}.tsv"
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._open[(window, partition)] = open(path, "a")  # noqa: SIM115 (close())
        f.write(tsv_line(self._cfg.feature_schema, row))
        self.positives[window] = self.positives.get(window, 0) + int(row["label"])

    def close(self, window: str) -> list[str]:
        """Close ``window`` (with a joined click: label and write its impressions); its
        files."""
        with self._lock:
            self._closed.add(window)
            for partition, event_id, at, row in self._held.pop(window, []):
                clicked = self._clicks.pop(event_id, None)
                row["label"] = int(clicked is not None and clicked - at <= self._click_ms)
                self._write(window, partition, row)
            for key in [k for k in self._open if k[0] == window]:
                self._open.pop(key).close()
        return sorted(str(p) for p in (self._root / "data" / window).glob("*.tsv"))

    def close_all(self) -> None:
        """Close every window still open (those after the last one trained)."""
        for window in {window for window, _ in self._open}:
            self.close(window)


def consume(cfg: PipelineConfig, files: WindowFiles, stop: threading.Event) -> None:
    """The impressions topic (and a joined click's) from its start into ``files``, until
    ``stop``."""
    clicks = [x.topic for x in cfg.topic_labels if x.name == "click"]
    consumer = KafkaConsumer(
        cfg.kafka.impressions_topic,
        *clicks,
        **client_settings(cfg.kafka),
        group_id=f"{cfg.kafka.consumer_group}-reference",
        auto_offset_reset="earliest",
    )
    try:
        while not stop.is_set():
            for tp, messages in consumer.poll(timeout_ms=200).items():
                for m in messages:
                    if tp.topic == cfg.kafka.impressions_topic:
                        files.add(tp.partition, m.value)
                    else:
                        files.add_click(m.value)
    finally:
        consumer.close()


def joined_before_training(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` for the reference's jobs: every label a plain column of the rows it writes
    (it joins before it writes), none of the rows ours writes for a fresh label."""
    if not cfg.topic_labels:
        return cfg
    schema = cfg.model_dump(mode="json", by_alias=True)["schema"]
    labels = [{"name": label.name} for label in cfg.labels]
    return derived(cfg, "the reference's model", schema={**schema, "labels": labels})


def train_window(
    cfg: PipelineConfig, root: Path, window: str, files: list[str], previous: str | None
) -> dict[str, Any]:
    """One pass's fleetrun job: load ``previous``'s model, train, save, export."""
    args = ["--files", ",".join(files), "--save", str(root / "checkpoints" / window)]
    args += ["--export", str(root / "models" / window)]
    if previous is not None:
        args += ["--load", str(root / "checkpoints" / previous)]
    started = time.time()
    reports = fleet_job(cfg, root / "jobs" / window, "reference_trainer.py", *args)
    return {"started": started, "done": time.time(), "train_s": max(r["seconds"] for r in reports)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--first", required=True, help="the first pass id to train")
    parser.add_argument("--passes", required=True, type=int)
    args = parser.parse_args()
    setup_logging()
    stop_on_sigterm()  # so a running job's process group is killed on the way out
    cfg = load_config(args.config)
    model_cfg = joined_before_training(cfg)
    files = WindowFiles(cfg, args.root, args.first)
    stop = threading.Event()
    consumer = threading.Thread(target=consume, args=(cfg, files, stop), daemon=True)
    consumer.start()
    clock = cfg.passes.clock
    # a window closes once its last impression's labels are in: its end plus the label's
    # window (none with labels in the impressions) plus the lateness
    wait_s = cfg.label_wait_seconds + cfg.passes.allowed_lateness_seconds
    window, previous = args.first, None
    with open(args.root / "passes.jsonl", "a") as out:
        for _ in range(args.passes):
            end = clock.window(window)[1] / 1000
            time.sleep(max(0.0, end + wait_s - time.time()))
            paths = files.close(window)
            result = train_window(model_cfg, args.root, window, paths, previous) if paths else {}
            record = {
                "pass_id": window,
                "rows": files.rows.get(window, 0),
                "positives": files.positives.get(window, 0),
                **result,
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
            log.info("reference pass %s: %s", window, record)
            previous = window if paths else previous
            window = clock.id_at(int(end * 1000))
    stop.set()
    consumer.join(10)
    files.close_all()
    dropped = {"late": files.late, "malformed": files.malformed}
    (args.root / "dropped.json").write_text(json.dumps(dropped))


if __name__ == "__main__":
    main()
