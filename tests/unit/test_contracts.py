"""The contracts layer: every value round-trips its wire functions (NaN metrics too), a
broken one fails naming the contract and the field, and the pass status is written only
with the contract of its field."""

from __future__ import annotations

import json
import math
import time

import pytest

from serving_export.manifest import ArtifactManifest
from streamrec.config import RedisConfig
from streamrec.contracts.catch_up import CatchUp, CaughtUp, Superseded
from streamrec.contracts.day_end import DayEnd, RetentionRun
from streamrec.contracts.delivery import Delivery, GateDecision, RedisPush
from streamrec.contracts.pass_status import (
    CONTRACT,
    PassField,
    PassStatus,
    read_statuses,
    record,
)
from streamrec.contracts.training import (
    ExportReply,
    MaintainReply,
    MaturedMetrics,
    PassMetrics,
    Progressive,
    ReaderType,
    SaveSummary,
    SyncMode,
)
from streamrec.errors import ContractError
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys

P = "202601010010"


def _values(train_result) -> list:
    gate = GateDecision(passed=False, auc=0.61, serving_auc=0.7, reasons=("AUC low",))
    save = SaveSummary(name=f"{P}-daily", kind="daily", path="/c", table_keys=9, saved_keys=9)
    maintained = MaintainReply(pass_id=P, day=P[:8], keys_before=10, checkpoint=save)
    push = RedisPush(version=P, layers_written=(P,), keys_written=3, seconds=0.1)
    return [
        train_result(P, sync_rounds={"rounds": 3, "batches": 2, "idle": 1, "dense_digest": "x"}),
        maintained,
        ExportReply(pass_id=P, raw_export="/e", seconds={"export": 1.0}),
        gate,
        Delivery(version=P, previous=None, switched=True, at=1.0, redis=push),
        CaughtUp(by_run_of="202601010000", at=2.0),
        Superseded(by="202601010020", delivers=True),
        CatchUp(pass_id=P, trained=(P,), decision=gate),
        DayEnd(maintain=maintained, retention=RetentionRun(pass_id=P, retention=False)),
        MaturedMetrics(
            pass_id=P,
            judged_in="202601010110",
            tasks={"click": PassMetrics(9, 0.7, 0.4, 1.0, 0.1, 0.2, 0.1, 0.1, 0.02)},
        ),
    ]


def test_every_contract_round_trips_its_wire_functions(train_result) -> None:
    for value in _values(train_result):
        assert type(value).from_wire(value.to_json()) == value
        assert type(value).from_wire(json.loads(json.dumps(value.to_wire()))) == value


def test_nan_metrics_stay_nan_on_the_wire(train_result) -> None:
    nan = PassMetrics(0, *[math.nan] * 8)
    empty = train_result(P, test=nan)
    back = type(empty).from_wire(empty.to_json())
    assert back.test.count == 0 and math.isnan(back.test.auc)
    # Airflow's XCom takes strict JSON only: to_wire spells them as strings, read back
    strict = json.dumps(empty.to_wire(), allow_nan=False)
    assert '"auc": "NaN"' in strict
    assert math.isnan(type(empty).from_wire(json.loads(strict)).test.auc)


def test_a_manifest_whose_gate_judged_no_matured_pass_reads_back(artifact_manifest) -> None:
    """A fresh label's first passes are judged before any pass has matured: AUC NaN."""
    unjudged = GateDecision(passed=True, auc=math.nan, serving_auc=None, fresh_auc=0.7)
    manifest = artifact_manifest("202601010000")
    manifest = manifest.model_copy(
        update={"metrics": manifest.metrics.model_copy(update={"gate": unjudged})}
    )
    back = ArtifactManifest.parse(manifest.to_json(), "the test")
    assert math.isnan(back.metrics.gate.auc) and back.metrics.gate.fresh_auc == 0.7


def test_the_modes_are_enums_and_an_unknown_mode_fails(train_result) -> None:
    result = train_result(P)
    assert (result.reader, result.progressive, result.sync_mode) == (
        ReaderType.QUEUE,
        Progressive.SAMPLE,
        SyncMode.ASYNC,
    )
    with pytest.raises(ContractError, match="reader"):
        type(result).from_wire({**result.to_wire(), "reader": "FileDataset"})


def test_a_broken_status_field_fails_naming_the_pass_and_the_field(train_result) -> None:
    good = {"train": train_result(P).to_json(), "gate": json.dumps({"passed": True})}
    with pytest.raises(ContractError) as failed:
        PassStatus.from_hash(P, good)
    assert all(s in str(failed.value) for s in (P, "gate", "GateDecision", "auc"))
    with pytest.raises(ContractError, match="unknown field 'gates'"):
        PassStatus.from_hash(P, {"gates": "{}"})
    assert PassStatus.from_hash(P, {}) == PassStatus(pass_id=P)


def test_each_status_field_takes_only_its_contract(train_result) -> None:
    class Hash:
        def __init__(self) -> None:
            self.fields: dict[str, str] = {}

        def hset(self, key: str, field: str, value: str) -> None:
            self.fields[field] = value

    keys, stored = RedisKeys("contracts"), Hash()
    values = {type(v): v for v in _values(train_result)}
    for field, contract in CONTRACT.items():
        record(stored, keys, P, field, values[contract])  # type: ignore[arg-type]
    status = PassStatus.from_hash(P, stored.fields)
    assert all(getattr(status, f.value) == values[CONTRACT[f]] for f in PassField)
    with pytest.raises(TypeError, match="GateDecision"):
        record(stored, keys, P, PassField.GATE, values[Superseded])  # type: ignore[arg-type]


def test_a_broken_status_raises_or_reads_as_nothing_done_when_tolerant(
    services, train_result
) -> None:
    """On a real redis-server: a display reads every other pass past a broken record."""
    r = connect(RedisConfig(url=services.redis_url))
    keys = RedisKeys(f"statuses-{time.time_ns()}")
    record(r, keys, P, PassField.TRAIN, train_result(P))
    r.hset(keys.pass_status("202601010020"), "gate", "{}")
    ids = [P, "202601010020"]
    with pytest.raises(ContractError, match="202601010020"):
        read_statuses(r, keys, ids)
    good, broken = read_statuses(r, keys, ids, tolerant=True)
    assert good.train == train_result(P) and broken == PassStatus(pass_id="202601010020")
