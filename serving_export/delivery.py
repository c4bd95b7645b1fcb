"""The per-pass delivery steps the DAG and the demo call: evaluate, publish, deliver.

evaluate  train result + serving model's metrics -> GateDecision (stored on the pass)
publish   raw export -> verified artifact on disk -> registered version
deliver   with the Redis sparse store, write the version's embeddings there first; then
          switch the serving pointer to that version (one Redis transaction)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import redis

from serving_export.artifact import package_export
from serving_export.errors import ExportInvalid, NothingServing
from serving_export.manifest import ArtifactManifest
from serving_export.quality_gate import judge
from serving_export.registry import ModelRegistry
from serving_export.sparse_store import InProcessStore, RedisStore
from streamrec.config import PipelineConfig
from streamrec.contracts.delivery import Delivery, GateDecision, RedisPush
from streamrec.contracts.pass_status import PassField, read_status, record
from streamrec.contracts.training import TrainResult
from streamrec.contracts.wire import Contract
from streamrec.layout import Layout
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys

log = logging.getLogger(__name__)


def _redis(cfg: PipelineConfig) -> redis.Redis:
    return connect(cfg.redis)


def registry_for(cfg: PipelineConfig) -> ModelRegistry:
    """The registry of this pipeline's model."""
    return ModelRegistry(_redis(cfg), RedisKeys(cfg.name), cfg.model.model)


def _record(cfg: PipelineConfig, pass_id: str, field: PassField, value: Contract) -> None:
    record(_redis(cfg), RedisKeys(cfg.name), pass_id, field, value)


def _stored_gate(cfg: PipelineConfig, pass_id: str) -> GateDecision | None:
    return read_status(_redis(cfg), RedisKeys(cfg.name), pass_id).gate


def evaluate(cfg: PipelineConfig, result: TrainResult) -> GateDecision:
    """Judge the pass's candidate against the gate and the serving model, once per pass:
    a re-run returns the stored decision instead of judging against a newer serving model."""
    stored = _stored_gate(cfg, result.pass_id)
    if stored is not None:
        return stored
    try:
        serving: GateDecision | None = registry_for(cfg).serving().metrics.gate
    except NothingServing:
        serving = None
    decision = judge(result, serving, cfg.gate, fresh=bool(cfg.feature_schema.fresh_labels))
    _record(cfg, result.pass_id, PassField.GATE, decision)
    log.info(
        "pass %s gate: %s %s",
        result.pass_id,
        "PASS" if decision.passed else "REJECT",
        "; ".join(decision.reasons),
    )
    return decision


def stored_decision(cfg: PipelineConfig, pass_id: str) -> GateDecision:
    """The gate decision ``evaluate`` stored on the pass; ExportInvalid without one."""
    decision = _stored_gate(cfg, pass_id)
    if decision is None:
        raise ExportInvalid(f"pass {pass_id} has no gate decision: evaluate it first")
    if not decision.passed:
        raise ExportInvalid(f"pass {pass_id} failed the gate: {'; '.join(decision.reasons)}")
    return decision


def publish(
    cfg: PipelineConfig, raw_export: str | Path, decision: GateDecision
) -> ArtifactManifest:
    """Package the raw export as an artifact and register it; its manifest."""
    manifest = package_export(cfg, Path(raw_export), decision)
    registry_for(cfg).register(manifest)
    return manifest


def sparse_store_for(cfg: PipelineConfig) -> InProcessStore | RedisStore:
    """The sparse store ``serving.sparse_store`` names."""
    model_dir = Layout.of(cfg.paths).model_dir(cfg.model.model)
    if cfg.serving.sparse_store == "redis":
        return RedisStore.from_config(cfg.redis, RedisKeys(cfg.name), cfg.model.model, model_dir)
    return InProcessStore(model_dir, cfg.serving.compact_ratio)


def deliver(cfg: PipelineConfig, version: str) -> Delivery:
    """Make ``version`` the serving model, unless a newer one already serves; with
    ``serving.canary_share`` (and a version serving) make it the candidate instead, which
    ``streamrec online`` promotes or withdraws on its online metrics. With the Redis sparse
    store its embeddings are written first: the pointer never names a version whose
    embeddings are incomplete."""
    store = sparse_store_for(cfg)
    pushed = store.push(version) if isinstance(store, RedisStore) else None
    registry = registry_for(cfg)
    serving = registry.serving_version()
    if cfg.serving.canary_share > 0 and serving is not None:
        before, proposed = registry.propose(version)
        log.info("%s on canary: %s", version, proposed or f"not after {before} / {serving}")
        return Delivery(
            version=version,
            previous=serving,
            switched=False,
            at=time.time(),
            redis=pushed,
            candidate=proposed,
        )
    return promote(cfg, version, pushed)


def promote(cfg: PipelineConfig, version: str, pushed: RedisPush | None = None) -> Delivery:
    """Move the serving pointer to ``version`` unless a newer one serves (its embeddings
    already in the store); the delivery's record, kept with the pass's status."""
    previous, switched = registry_for(cfg).promote(version)
    result = Delivery(
        version=version, previous=previous, switched=switched, at=time.time(), redis=pushed
    )
    if switched:
        _record(cfg, version, PassField.DELIVERED, result)
        log.info("serving %s (was %s)", version, previous)
    else:
        log.info("not switching to %s: %s already serves", version, previous)
    return result


def withdraw_candidate(cfg: PipelineConfig, version: str, reason: str) -> bool:
    """Withdraw the candidate ``version`` for ``reason``; what serves is unchanged."""
    withdrawn = registry_for(cfg).withdraw_candidate(version, reason)
    if withdrawn:
        log.warning("candidate %s withdrawn: %s", version, reason)
    return withdrawn


def withdraw(cfg: PipelineConfig, version: str, to: str, reason: str) -> tuple[str | None, bool]:
    """Withdraw ``version`` for ``reason`` and serve ``to`` again if it serves (its Redis
    embeddings written first when they are missing): the version serving before and
    whether the pointer moved. A withdrawn version is never promoted again."""
    store = sparse_store_for(cfg)
    if isinstance(store, RedisStore):
        store.push(to)
    return registry_for(cfg).withdraw(version, to, reason)


def rollback(cfg: PipelineConfig, version: str) -> tuple[str | None, bool]:
    """Serve an older registered ``version`` again (its Redis embeddings written first when
    they are missing); the version serving before and whether the pointer moved."""
    store = sparse_store_for(cfg)
    if isinstance(store, RedisStore):
        store.push(version)
    return registry_for(cfg).rollback(version)
