"""Both Paddle readers on the real cluster: QueueDataset (streamed through the pipe reader,
here with two reader threads, whose metrics come from per-instance dumps) and
InMemoryDataset (loaded once, globally shuffled across workers before training); and both
places the progressive metrics come from: the training run itself (``in_train``, one read)
or a separate inference run before it, on the whole pass or on every k-th row
(``sample``). After training, the intercept refit scores a sample
of the pass (every k-th row) with either reader."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from streaming.pass_builder import PassBuilder
from streaming.producer import make_producer, messages_for, send_messages, synthetic_passes
from streaming.topics import ensure_topic
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import pass_dir, read_manifest
from trainers.launcher import LocalCluster

FIRST, SECOND = "202606010000", "202606010010"


def _with_runner(cfg: PipelineConfig, **runner: object) -> PipelineConfig:
    return derived(cfg, f"the config with {runner}", model={"runner": runner})


@pytest.mark.parametrize(
    ("reader", "threads", "progressive"),
    [
        ("InMemoryDataset", 1, "separate"),
        ("QueueDataset", 2, "in_train"),
        ("QueueDataset", 1, "sample"),
    ],
)
def test_reader_trains_every_row_once(
    make_config, reader: str, threads: int, progressive: str
) -> None:
    cfg = _with_runner(
        make_config(join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 12000}),
        reader_type=reader,
        thread_num=threads,
        progressive=progressive,
        intercept_rows=5000,  # the refit scores a sample: every 3rd row of 12,000
        progressive_rows=4000,  # progressive: sample scores every 3rd row before training
    )
    ensure_topic(cfg.kafka, cfg.kafka.impressions_topic, cfg.kafka.partitions)
    producer = make_producer(cfg.kafka)
    for _, batch in synthetic_passes(cfg, FIRST, 2):
        send_messages(producer, messages_for(cfg, batch))
    producer.close()
    builder = PassBuilder(cfg)
    try:
        builder.run(until_pass=SECOND, idle_timeout_s=60)
    finally:
        builder.close()
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        results = [cluster.client.train(p) for p in (FIRST, SECOND)]
        per_worker = cluster.client.worker_results("train", SECOND)
    for pass_id, result in zip((FIRST, SECOND), results, strict=True):
        manifest = read_manifest(pass_dir(cfg.paths.data_root, pass_id))
        rows = manifest.rows
        assert result.reader == reader
        # every row trained once and scored once (or every 3rd, the sample), with one reader
        # thread or several
        scored = sum(math.ceil(p.rows / 3) for p in manifest.parts)
        assert result.train.count == rows
        assert result.test.count == (scored if progressive == "sample" else rows)
        assert result.count_matches_manifest
        assert result.progressive == progressive
        assert result.progressive_every == {"separate": 1, "sample": 3, "in_train": 0}[progressive]
        if progressive != "in_train":  # an inference run first, with the pass's own figures
            assert "test" in result.seconds and result.test != result.train
        else:  # one read: the training run's batch-before-update figures
            assert "test" not in result.seconds and result.test == result.train
        # the intercept refit scored every k-th row of each part, on both readers
        refit = result.intercept
        assert refit is not None and refit.every == math.ceil(rows / 5000) == 3
        assert refit.rows == sum(math.ceil(p.rows / 3) for p in manifest.parts)
        assert math.isfinite(refit.shift) and refit.shift != 0
    assert results[1].test.auc > 0.6
    assert per_worker[0]["train"] == per_worker[1]["train"]  # one all-reduced view
    # the servers keep the mean of the pass's dense iterates, over every batch of both
    # workers (each reader thread's last batch may be short), and both workers hold it
    averaged = [w["dense_average"] for w in per_worker.values()]
    assert averaged[0] == averaged[1], averaged
    rows = read_manifest(pass_dir(cfg.paths.data_root, SECOND)).rows
    least = math.ceil(rows / results[1].batch_size)
    assert least <= averaged[0]["batches"] <= least + 2 * threads, (averaged, least)
