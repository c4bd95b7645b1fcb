"""A finished log replayed as a new user does it, through ``streamrec produce --file`` and
``streamrec build-passes`` on the session's Apache Kafka: ``--drain`` cuts the windows a
stream that has ended never closes (every event in exactly one pass, a SIGKILL in the
middle included), and labels are read by their name (a conversion pipeline never trains a
file of clicks as conversions: it dead-letters them, naming the field it expected)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from kafka import KafkaConsumer, TopicPartition

from streaming.synthetic import SyntheticStream
from streamrec.config import PipelineConfig, dump_config
from streamrec.passes import PassClock, complete_passes, pass_dir, read_manifest, slices_root

pytestmark = [pytest.mark.timeout(300)]

CLI = str(Path(sys.executable).with_name("streamrec"))
START_MS = 1782864000000  # 2026-07-01 00:00 UTC
WINDOWS = 3


def _events(cfg: PipelineConfig, n: int) -> list[dict[str, Any]]:
    """``n`` synthetic impressions spread over ``WINDOWS`` ten-minute windows, labels in."""
    end = START_MS + WINDOWS * cfg.passes.clock.width_ms
    return SyntheticStream(cfg.feature_schema, cfg.synthetic).batch(START_MS, end, n).events


def _produce(config: Path, events: list[dict[str, Any]], folder: Path) -> None:
    file = folder / "events.jsonl"
    file.write_text("".join(json.dumps(e) + "\n" for e in events))
    done = subprocess.run(
        [CLI, "produce", "--config", str(config), "--file", str(file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _build(config: Path, *flags: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [CLI, "build-passes", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _rows(cfg: PipelineConfig) -> dict[str, dict[str, Any]]:
    """event_id -> its row over every complete pass; no event in two passes."""
    seen: dict[str, dict[str, Any]] = {}
    for pass_id in complete_passes(cfg.paths.data_root):
        directory = pass_dir(cfg.paths.data_root, pass_id)
        for part in read_manifest(directory).parts:
            for row in pq.read_table(directory / part.file).to_pylist():
                assert row["event_id"] not in seen, f"{row['event_id']} is in two passes"
                seen[row["event_id"]] = {**row, "pass_id": pass_id}
    return seen


def _dead_letters(cfg: PipelineConfig) -> list[Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=cfg.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    consumer.assign([TopicPartition(cfg.kafka.impressions_topic + cfg.kafka.dlq_suffix, 0)])
    try:
        return list(consumer)
    finally:
        consumer.close()


def test_a_drained_replay_puts_every_event_in_exactly_one_pass(make_config, tmp_path) -> None:
    """Without ``--drain`` the last window of a finished log never closes (nothing later
    arrives to move the watermark past it); with it every window is cut, once, even when
    the drain is SIGKILLed after its first slice and run again."""
    cfg = make_config(
        join={"mode": "label_in_impression"},
        passes={"allowed_lateness_seconds": 10, "idle_partition_seconds": 2},
    )
    config = dump_config(cfg, tmp_path / "replay.yaml")
    events = _events(cfg, 3000)
    _produce(config, events, tmp_path)
    window = {e["event_id"]: PassClock(600).id_at(e["event_time"]) for e in events}
    last = max(window.values())
    _build(config, "--idle-timeout", "8")  # the replay as it ran before: the tail is left
    assert last not in complete_passes(cfg.paths.data_root)

    # SIGKILL the drain after it has published its first slice, then drain again
    before = len(list(slices_root(cfg.paths.data_root).glob("*/*/p*/_SUCCESS")))
    proc = subprocess.Popen(
        [CLI, "build-passes", "--config", str(config), "--drain"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(list(slices_root(cfg.paths.data_root).glob("*/*/p*/_SUCCESS"))) == before:
        assert proc.poll() is None and time.monotonic() < deadline, "the drain cut nothing"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    done = _build(config, "--drain")
    assert "cutting every window left" in done.stderr
    rows = _rows(cfg)
    assert set(rows) == {e["event_id"] for e in events}  # every event, none twice
    assert {r["label"] for r in rows.values()} == {0, 1}
    assert last in complete_passes(cfg.paths.data_root)
    assert all(
        (rows[e["event_id"]]["label"], rows[e["event_id"]]["pass_id"])
        == (e["label"], window[e["event_id"]])
        for e in events
    )
    _build(config, "--drain")  # a finished log drained again: nothing new, nothing twice
    assert set(_rows(cfg)) == set(rows)


def test_a_label_is_read_by_its_name(make_config, tmp_path) -> None:
    """A pipeline whose one label is a conversion: a file of clicks (``label``) is
    dead-lettered with the field it expected, never trained as conversions; conversions in
    ``label_conversion`` or in the label object are trained."""
    clicks = make_config(join={"mode": "label_in_impression"})
    schema = clicks.feature_schema.model_dump(mode="json")
    cfg = make_config(
        join={"mode": "label_in_impression"},
        schema={**schema, "labels": [{"name": "conversion"}]},
        passes={"allowed_lateness_seconds": 10, "idle_partition_seconds": 2},
    )
    config = dump_config(cfg, tmp_path / "conversions.yaml")
    events = _events(clicks, 600)
    for i, event in enumerate(events):
        label = event.pop("label")  # the generator's clicks stand in for conversions
        if i % 3 == 0:
            event["label"] = label  # a click log's field
        elif i % 3 == 1:
            event["label_conversion"] = label
        else:
            event["labels"] = {"conversion": label, "click": 1 - label}
    _produce(config, events, tmp_path)
    _build(config, "--drain")
    rows = _rows(cfg)
    trained = {e["event_id"] for i, e in enumerate(events) if i % 3}
    assert set(rows) == trained
    expected = {
        e["event_id"]: e.get("label_conversion", e.get("labels", {}).get("conversion"))
        for e in events
    }
    assert all(rows[i]["label"] == expected[i] for i in trained)
    letters = _dead_letters(cfg)
    assert len(letters) == len(events) - len(trained)
    headers = Counter((dict(m.headers)["reason"], dict(m.headers)["detail"]) for m in letters)
    assert list(headers) == [
        (
            b"missing_label",
            b"label_conversion or labels.conversion: this pipeline's label 'conversion'",
        )
    ]
