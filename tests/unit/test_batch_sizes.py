"""Rows per batch: training's follow the worker's share of the pass, scoring's are large
(pure arithmetic on the runner config)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from streamrec.config import ModelConfig, RunnerConfig
from trainers.worker.pass_reads import SCORE_BATCH_SIZE, scoring_batch_size, training_batch_size

# the rule with 64 batches a pass, so the middle range is wide; the shipped defaults below
ADAPTIVE = RunnerConfig(batch_size=512, min_batch_size=64, min_batches_per_pass=64)


def test_a_large_share_trains_in_the_largest_batch() -> None:
    assert training_batch_size(ADAPTIVE, 100_000) == 512  # the bench's 200,000-row pass
    assert training_batch_size(ADAPTIVE, 512 * 64) == 512


def test_a_middle_share_is_cut_into_the_batches_asked_for() -> None:
    for share in (5_000, 10_000, 512 * 63):
        batch = training_batch_size(ADAPTIVE, share)
        assert 64 < batch < 512
        assert math.ceil(share / batch) >= 64  # never fewer batches than asked for
        assert batch == math.ceil(share / 64)  # and as large as that allows


def test_a_small_share_keeps_the_smallest_batch() -> None:
    assert training_batch_size(ADAPTIVE, 2_000) == 64  # the KDD replay's 4,000-row passes
    assert training_batch_size(ADAPTIVE, 4_096) == 64
    assert training_batch_size(ADAPTIVE, 0) == 64  # a worker without rows still builds a read


def test_a_fixed_batch() -> None:
    runner = RunnerConfig(batch_size=64, min_batch_size=1, min_batches_per_pass=1)
    assert training_batch_size(runner, 2_000) == 64
    assert training_batch_size(runner, 10) == 10
    small = RunnerConfig(batch_size=32, min_batch_size=64)  # the largest batch wins
    assert training_batch_size(small, 100_000) == 32


def test_the_shipped_rule() -> None:
    shipped = RunnerConfig()
    assert (shipped.batch_size, shipped.min_batches_per_pass, shipped.min_batch_size) == (
        512,
        32,
        64,
    )
    assert training_batch_size(shipped, 100_000) == 512  # the bench's 200,000-row pass
    assert training_batch_size(shipped, 5_000) == 157  # Criteo's 10,000-row passes
    assert training_batch_size(shipped, 2_000) == 64  # KDD's 4,000-row passes: the floor


def test_scoring_reads_large_batches() -> None:
    assert scoring_batch_size(RunnerConfig(batch_size=64)) == SCORE_BATCH_SIZE
    assert scoring_batch_size(RunnerConfig(batch_size=8192)) == 8192


def test_the_seed_is_positive_or_null() -> None:
    optimizer = {"class": "adam", "learning_rate": 0.001}
    model = {"model": "ctr_dnn", "hyper_parameters": {"optimizer": optimizer}}
    assert ModelConfig.model_validate(model).seed == 2012
    assert ModelConfig.model_validate({**model, "seed": None}).seed is None
    with pytest.raises(ValidationError, match="seed"):
        ModelConfig.model_validate({**model, "seed": 0})  # Paddle reads 0 as "unseeded"
