"""Which pass a run's catch-up trains next (the following complete pass, only when every
window before it will never have a pass), and when a pass counts as caught up (on a real
redis-server)."""

from __future__ import annotations

import json
from pathlib import Path

from ops.catchup import caught_up_by, next_pass
from streamrec.config import PipelineConfig, derived
from streamrec.contracts.catch_up import CatchUp, CaughtUp
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.pass_status import PassField, record
from streamrec.passes import pass_dir, slice_dir
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys


def _complete(root: Path, pass_id: str) -> None:
    d = pass_dir(root, pass_id)
    d.mkdir(parents=True)
    (d / "_SUCCESS").touch()


def test_the_backlog_is_taken_in_order_and_stops_at_a_pending_window(
    shipped_config: PipelineConfig, tmp_path: Path
) -> None:
    cfg = derived(shipped_config, "the catch-up's config", paths={"data_root": tmp_path})
    assert cfg.passes.pass_seconds == 600
    for pass_id in ("202601010000", "202601010010", "202601010030", "202601010050"):
        _complete(tmp_path, pass_id)
    slice_dir(tmp_path, "202601010040", 0).parent.mkdir(parents=True)  # still being written
    assert next_pass(cfg, "202601010000") == "202601010010"
    assert next_pass(cfg, "202601010010") == "202601010030"  # 0020 never comes
    assert next_pass(cfg, "202601010030") is None  # 0040 pending: 0050 must wait
    assert next_pass(cfg, "202601010050") is None  # nothing after it yet


def test_a_fresh_model_starts_at_the_schedule_or_the_oldest_pass(
    shipped_config: PipelineConfig, tmp_path: Path
) -> None:
    cfg = derived(shipped_config, "the follower's config", paths={"data_root": tmp_path})
    assert next_pass(cfg, None) is None  # nothing complete yet
    for pass_id in ("202601010000", "202601010030"):
        _complete(tmp_path, pass_id)
    unscheduled = derived(cfg, "no schedule", schedule=None)
    assert next_pass(unscheduled, None) == "202601010000"
    later = derived(cfg, "a later start", schedule={"start": "2026-01-01T00:12:00Z"})
    assert next_pass(later, None) == "202601010030"  # 0010 and 0020 never come
    slice_dir(tmp_path, "202601010020", 0).parent.mkdir(parents=True)
    assert next_pass(later, None) is None  # 0020 is being written: it comes first


def test_the_result_crosses_xcom_as_json() -> None:
    decision = GateDecision(passed=True, auc=0.7, serving_auc=0.69)
    caught = CatchUp(
        pass_id="202601010030", trained=("202601010010", "202601010030"), decision=decision
    )
    assert CatchUp.from_wire(json.loads(json.dumps(caught.to_wire()))) == caught


def test_a_pass_counts_as_caught_up_once_trained_not_when_only_claimed(
    make_config, train_result
) -> None:
    """The catch-up claims a pass before it trains it; a run whose sensor sees only the
    claim (the catch-up failed, its run was marked done by hand) must train the pass."""
    cfg = make_config()
    r, keys, pass_id = connect(cfg.redis), RedisKeys(cfg.name), "202601010010"
    claim = CaughtUp(by_run_of="202601010000", at=1.0)
    record(r, keys, pass_id, PassField.CAUGHT_UP, claim)
    assert caught_up_by(cfg, pass_id) is None
    record(r, keys, pass_id, PassField.TRAIN, train_result(pass_id))
    assert caught_up_by(cfg, pass_id) == claim
    assert caught_up_by(cfg, "202601010020") is None
