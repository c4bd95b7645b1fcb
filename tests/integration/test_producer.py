"""The producer CLI pushes events a consumer can read back, one message per event."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from streamrec.config import dump_config


def _read_all(bootstrap: str, topic: str, partitions: int) -> list[dict]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    events = [json.loads(m.value) for m in consumer]
    consumer.close()
    return events


def test_produce_from_file_and_synthetic(make_config, tmp_path: Path) -> None:
    cfg = make_config(synthetic={"events_per_pass": 200})
    path = dump_config(cfg, tmp_path / "cfg.yaml")
    lines = [
        json.dumps({"event_id": f"f{i}", "event_time": 1767225600000 + i, "label": i % 2})
        for i in range(5)
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n\n")
    run = [sys.executable, "-m", "streaming.producer", "--config", str(path)]
    subprocess.run(
        [*run, "--file", str(tmp_path / "events.jsonl")], check=True, capture_output=True
    )
    subprocess.run([*run, "--synthetic", "--passes", "2"], check=True, capture_output=True)
    events = _read_all(
        cfg.kafka.bootstrap_servers, cfg.kafka.impressions_topic, cfg.kafka.partitions
    )
    ids = [e["event_id"] for e in events]
    assert len(ids) == len(set(ids)) == 5 + 2 * 200 + 10  # file + two passes + the closing tail
    assert {f"f{i}" for i in range(5)} <= set(ids)
