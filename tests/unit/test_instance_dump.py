"""Reading Paddle's per-instance dumps back, and metrics from them equal the accumulators'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainers.metrics import STAT_NAMES, bucketize, metrics_from_stats, stats_from_predictions
from trainers.worker.instance_dump import read_dump, read_dump_with_ids


def _write(path: Path, scores: np.ndarray, labels: np.ndarray) -> None:
    # the device worker's line: no instance id, then "\t<field>:<len>:<value>" per field
    lines = [
        f"\tsigmoid_0.tmp_0:1:{s:.6g}\tlabel:1:{y}" for s, y in zip(scores, labels, strict=True)
    ]
    path.write_text("".join(line + "\n" for line in lines))


def test_every_dumped_instance_is_read_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    scores = rng.random(1000).astype(np.float32)
    labels = (rng.random(1000) < scores).astype(np.int64)
    _write(tmp_path / "part-000-00000", scores[:600], labels[:600])
    _write(tmp_path / "part-000-00001", scores[600:], labels[600:])
    (tmp_path / "part-000-00002").write_text("")  # a dump thread that got nothing
    read_scores, read_labels = read_dump(tmp_path, 2)
    assert len(read_scores) == 1000
    assert np.array_equal(read_labels, labels)
    np.testing.assert_allclose(read_scores, scores, rtol=1e-5)
    assert read_dump(tmp_path / "nothing", 2)[0].size == 0


def test_a_field_with_several_values_is_refused(tmp_path: Path) -> None:
    (tmp_path / "part-000-00000").write_text("\tpred:2:0.1:0.9\tlabel:1:0\n")
    with pytest.raises(ValueError, match="one value per instance"):
        read_dump(tmp_path, 2)


def test_stats_from_predictions_match_the_graph_accumulators_formulas() -> None:
    rng = np.random.default_rng(4)
    p = rng.random(500)
    y = (rng.random(500) < p).astype(np.int64)
    pos, neg, sums = stats_from_predictions(p, y, 4095)
    assert set(sums) == set(STAT_NAMES) and sums["count"] == 500
    expected_pos, expected_neg = bucketize(p, y, 4095)
    assert np.array_equal(pos, expected_pos) and np.array_equal(neg, expected_neg)
    m = metrics_from_stats(pos, neg, sums)
    assert m.copc == pytest.approx(y.sum() / p.sum(), abs=1e-9)
    assert m.rmse == pytest.approx(np.sqrt(np.mean((y - p) ** 2)), abs=1e-9)


def test_dumps_with_instance_ids_pair_each_value_with_its_row(tmp_path: Path) -> None:
    ids = ["imp%201", "imp-2", "imp%253"]  # as the pipe reader escapes them
    lines = [f"{i}\t\tsigmoid_0.tmp_0:1:{p}" for i, p in zip(ids, [0.25, 0.5, 0.75], strict=True)]
    (tmp_path / "part-000-00000").write_text("\n".join(lines[:2]) + "\n")
    (tmp_path / "part-000-00001").write_text(lines[2] + "\n")
    got_ids, (scores,) = read_dump_with_ids(tmp_path, 1)
    assert got_ids.tolist() == ids
    assert scores.tolist() == [0.25, 0.5, 0.75]
