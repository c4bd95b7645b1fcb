"""The model registry in Redis: versions and the serving pointer.

Each version's ``serving_export.manifest.ArtifactManifest`` is kept as JSON; ``promote``
switches the pointer, stamps the version's ``freshness.served_at`` and appends
to the history in one transaction (redis-py's ``transaction``, WATCH on the pointer), so
readers see the old version or the new one and concurrent switches cannot interleave. It
only moves forward (versions are pass ids, so they sort by time): a re-run of an old pass
never replaces a newer model; ``rollback`` is the explicit way back.
Key names: ``streamrec.redis_keys``.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import redis

from serving_export.errors import NothingServing, RegistryConflict
from serving_export.manifest import ArtifactManifest
from streamrec.contracts.registry import OnlineMetrics, ReplicaNote, Switch, Withdrawal
from streamrec.redis_conn import scan_keys
from streamrec.redis_keys import RedisKeys


class ModelRegistry:
    """Versions of one model and which one serves."""

    def __init__(self, r: redis.Redis, keys: RedisKeys, model: str) -> None:
        self._r = r
        self._keys = keys
        self._model = model

    def register(self, manifest: ArtifactManifest) -> None:
        """Record a published artifact's manifest under its version."""
        self._r.hset(
            self._keys.registry_versions(self._model), manifest.version, manifest.to_json()
        )

    def forget(self, version: str) -> None:
        """Drop a version's registry entry (retention; never the serving version)."""
        if version == self.serving_version():
            raise RegistryConflict(f"{self._model} {version} is serving; it cannot be forgotten")
        self._r.hdel(self._keys.registry_versions(self._model), version)

    def history(self, limit: int = 20) -> list[Switch]:
        """The newest pointer switches, newest first."""
        key = self._keys.registry_history(self._model)
        return [Switch.from_wire(h, key) for h in self._r.lrange(key, 0, limit - 1)]

    def versions(self) -> list[str]:
        return sorted(self._r.hkeys(self._keys.registry_versions(self._model)))

    def manifest(self, version: str) -> ArtifactManifest:
        """The registered manifest of ``version``; NothingServing when there is none."""
        versions = self._keys.registry_versions(self._model)
        raw = self._r.hget(versions, version)
        if raw is None:
            raise NothingServing(f"version {version} of {self._model} is not registered")
        return ArtifactManifest.parse(raw, f"Redis {versions}[{version}]")

    def note_replica(self, note: ReplicaNote, ttl_s: float) -> None:
        """A running service says which version it serves; the note expires after
        ``ttl_s`` unless renewed."""
        key = self._keys.registry_replica(self._model, note.replica)
        self._r.set(key, note.to_json(), px=int(ttl_s * 1000))

    def replicas(self) -> list[ReplicaNote]:
        """What every running service noted, by replica name."""
        keys = sorted(scan_keys(self._r, self._keys.registry_replica(self._model, "*")))
        notes = self._r.mget(keys) if keys else []
        return [ReplicaNote.from_wire(v, k) for k, v in zip(keys, notes, strict=True) if v]

    def serving_version(self) -> str | None:
        return self._r.get(self._keys.registry_serving(self._model))

    def serving(self) -> ArtifactManifest:
        """Manifest of the serving version."""
        version = self.serving_version()
        if version is None:
            raise NothingServing(f"no version of {self._model} is serving yet")
        return self.manifest(version)

    def predecessor(self, version: str) -> str | None:
        """The version that served just before ``version`` was last promoted (a rollback
        to ``version`` is no promotion: it does not change what came before it)."""
        for switch in self.history(limit=1000):
            previous = switch.previous
            if switch.version == version and (previous is None or previous < version):
                return previous
        return None

    def withdrawn(self) -> dict[str, Withdrawal]:
        """Versions withdrawn on their online metrics (the alarm, the canary), and why."""
        key = self._keys.registry_withdrawn(self._model)
        return {v: Withdrawal.from_wire(w, f"{key}[{v}]") for v, w in self._r.hgetall(key).items()}

    def record_online(self, version: str, metrics: list[OnlineMetrics]) -> None:
        """Keep ``version``'s online metrics (per task) where services read them."""
        wire = json.dumps([m.to_wire() for m in metrics])
        self._r.hset(self._keys.registry_online(self._model), version, wire)

    def online(self, version: str) -> list[OnlineMetrics]:
        """``version``'s online metrics per task as last recorded; [] when none are."""
        key = self._keys.registry_online(self._model)
        raw = self._r.hget(key, version)
        return [OnlineMetrics.from_wire(m, f"{key}[{version}]") for m in json.loads(raw or "[]")]

    def candidate(self) -> str | None:
        """The version on canary: answering ``serving.canary_share`` until ``streamrec
        online`` promotes or withdraws it."""
        return self._r.get(self._keys.registry_candidate(self._model))

    def propose(self, version: str) -> tuple[str | None, bool]:
        """Make ``version`` the candidate unless it was withdrawn, or the same or a newer
        version serves or is the candidate (a newer candidate replaces an older one, never
        judged). Returns the candidate before and whether it changed."""
        pointer = self._keys.registry_serving(self._model)
        candidate = self._keys.registry_candidate(self._model)
        withdrawn = self._keys.registry_withdrawn(self._model)
        self.manifest(version)

        def put(pipe: redis.client.Pipeline) -> tuple[str | None, bool]:
            serving, before = pipe.get(pointer), pipe.get(candidate)
            newer = all(v is None or version > v for v in (serving, before))
            if not newer or pipe.hexists(withdrawn, version):
                return before, False
            pipe.multi()
            pipe.set(candidate, version)
            pipe.publish(self._keys.registry_moves(self._model), version)
            return before, True

        return self._r.transaction(put, pointer, candidate, withdrawn, value_from_callable=True)

    def moves(self) -> redis.client.PubSub:
        """A subscription to the moves of the serving pointer and the candidate: each
        publishes its version, in the transaction that makes it (a reader that missed one
        reads the pointer anyway: a subscription is a wake-up, not the truth)."""
        pubsub = self._r.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self._keys.registry_moves(self._model))
        return pubsub

    def withdraw_candidate(self, version: str, reason: str) -> bool:
        """Withdraw the candidate ``version`` for ``reason`` (never proposed or promoted
        again); False when it is no longer the candidate."""
        candidate = self._keys.registry_candidate(self._model)
        withdrawn = self._keys.registry_withdrawn(self._model)

        def drop(pipe: redis.client.Pipeline) -> bool:
            if pipe.get(candidate) != version:
                return False
            pipe.multi()
            pipe.hset(withdrawn, version, Withdrawal(reason=reason, at=time.time()).to_json())
            pipe.delete(candidate)
            return True

        return self._r.transaction(drop, candidate, value_from_callable=True)

    def promote(self, version: str) -> tuple[str | None, bool]:
        """Make ``version`` serve unless the same or a newer version already does, or it
        was withdrawn. Returns the version serving before and whether the pointer moved."""
        return self._switch(version, lambda current: current is None or version > current)

    def rollback(self, version: str) -> tuple[str | None, bool]:
        """Make an older registered ``version`` serve again."""
        return self._switch(version, lambda current: current != version)

    def withdraw(self, version: str, to: str, reason: str) -> tuple[str | None, bool]:
        """Withdraw ``version`` for ``reason`` (it is never promoted again) and, if it
        serves, make ``to`` serve again: both in one transaction."""
        return self._switch(to, lambda current: current == version, (version, reason))

    def _switch(
        self, version: str, allowed, withdraw: tuple[str, str] | None = None
    ) -> tuple[str | None, bool]:
        self.manifest(version)
        pointer = self._keys.registry_serving(self._model)
        versions = self._keys.registry_versions(self._model)
        withdrawn = self._keys.registry_withdrawn(self._model)
        candidate = self._keys.registry_candidate(self._model)

        # redis-py runs this again whenever the pointer moved before EXEC (WATCH)
        def switch(pipe: redis.client.Pipeline) -> tuple[str | None, bool]:
            previous = pipe.get(pointer)
            if not allowed(previous) or pipe.hexists(withdrawn, version):
                return previous, False
            manifest = ArtifactManifest.parse(pipe.hget(versions, version), versions)
            served = manifest.served(datetime.now(UTC).isoformat())
            proposed = pipe.get(candidate)
            why = None
            pipe.multi()
            if withdraw is not None:
                gone, reason = withdraw
                note = Withdrawal(reason=reason, at=time.time())
                pipe.hset(withdrawn, gone, note.to_json())
                why = f"{gone} withdrawn: {reason}"
            pipe.set(pointer, version)
            if proposed is not None and proposed <= version:
                pipe.delete(candidate)  # judged, or older than what serves now
            pipe.hset(versions, version, served.to_json())
            record = Switch(version=version, previous=previous, ts=time.time(), reason=why)
            pipe.lpush(self._keys.registry_history(self._model), record.to_json())
            pipe.publish(self._keys.registry_moves(self._model), version)
            return previous, True

        return self._r.transaction(switch, pointer, withdrawn, candidate, value_from_callable=True)
