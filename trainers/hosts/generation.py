"""The cluster generation: how the node agents of every host agree, through Redis, on when
the whole cluster stops and starts again.

A Paddle parameter-server job cannot take a lost member back, so a cluster spread over
hosts restarts as a whole. The generation is a counter with a state:

    forming   the nodes stop their members and join (``ready``); when every node of the
              config is ready, with the incarnation it is heartbeating now, it becomes
    started   each node that joined starts its members (fleetrun) once, with the
              generation's start time as the cluster's start (``STARTED_ENV``)

Any node that sees trouble in a started generation (one of its members died, another node's
heartbeat expired or changed incarnation, a node that was not in it wants to join) bumps the
counter to a new forming generation, naming the cause. Bumps are compare-and-set on the
counter (redis-py's ``transaction``), so several nodes seeing the same loss make one bump.
Keys (``streamrec.redis_keys``)::

    cluster:generation     HASH    gen, state, cause, by, at_ms, started_ms
    cluster:ready:<gen>    HASH    node -> incarnation of the agents that joined <gen>
    cluster:node:<name>    STRING  JSON NodeBeat of the node's agent, expires after
                                   cluster.node_timeout_seconds
    cluster:history        LIST    JSON of every generation that started, newest first
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import redis

from streamrec.redis_keys import RedisKeys
from trainers.control_plane import redis_time_ms

GenerationState = Literal["forming", "started"]
HISTORY_KEPT = 100


@dataclass(frozen=True)
class Generation:
    """The cluster's current generation."""

    number: int
    state: GenerationState
    cause: str  # why it began: "first start", "process death on node a: ...", ...
    by: str  # the node that began it
    at_ms: int  # Redis time when it began forming
    started_ms: int = 0  # Redis time when every node had joined; 0 while forming

    @classmethod
    def from_hash(cls, raw: dict[str, str]) -> Generation | None:
        if not raw:
            return None
        return cls(
            int(raw["gen"]),
            raw["state"],  # type: ignore[arg-type]
            raw.get("cause", ""),
            raw.get("by", ""),
            int(raw.get("at_ms", 0)),
            int(raw.get("started_ms", 0)),
        )


@dataclass(frozen=True)
class NodeBeat:
    """What a node agent says of itself with each heartbeat."""

    node: str
    address: str
    incarnation: str  # one per agent process: a restarted node is a new one
    generation: int  # the generation its members run (or it waits for)
    state: str  # waiting | starting | running | stopping | isolated
    members: list[dict[str, Any]] = field(default_factory=list)  # {role, pid}
    host: str = ""
    ts_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> NodeBeat:
        return cls(**json.loads(raw))


class GenerationStore:
    """The generation keys of one pipeline's cluster, for the nodes named in the config."""

    def __init__(self, r: redis.Redis, keys: RedisKeys, nodes: list[str]) -> None:
        self._r = r
        self._keys = keys
        self.nodes = nodes

    def read(self) -> Generation | None:
        return Generation.from_hash(self._r.hgetall(self._keys.cluster_generation))

    def bump(self, expected: int | None, cause: str, by: str) -> Generation:
        """Begin generation ``expected + 1`` (forming), unless the counter has moved past
        ``expected`` already (another node saw the trouble first); the current one."""
        key = self._keys.cluster_generation

        def begin(pipe: redis.client.Pipeline) -> None:
            current = Generation.from_hash(pipe.hgetall(key))
            if current is not None and current.number != expected:
                return
            number = (current.number if current else 0) + 1
            now = redis_time_ms(pipe)
            pipe.multi()
            pipe.delete(key)
            pipe.hset(
                key,
                mapping={"gen": number, "state": "forming", "cause": cause, "by": by, "at_ms": now},
            )

        self._r.transaction(begin, key)
        generation = self.read()
        assert generation is not None
        return generation

    def join(self, number: int, node: str, incarnation: str) -> bool:
        """Node ``node`` has stopped its members and waits for generation ``number``; False
        when that generation is no longer forming (join the next one)."""
        key = self._keys.cluster_generation
        ready = self._keys.cluster_ready(number)

        def add(pipe: redis.client.Pipeline) -> bool:
            current = Generation.from_hash(pipe.hgetall(key))
            if current is None or current.number != number or current.state != "forming":
                return False
            pipe.multi()
            pipe.hset(ready, node, incarnation)
            pipe.expire(ready, 7 * 24 * 3600)
            return True

        return self._r.transaction(add, key, value_from_callable=True)

    def ready(self, number: int) -> dict[str, str]:
        """node -> incarnation of the agents that joined generation ``number``."""
        return self._r.hgetall(self._keys.cluster_ready(number))

    def start_if_complete(self, number: int, beats: dict[str, NodeBeat]) -> Generation | None:
        """Mark generation ``number`` started once every node has joined it with the
        incarnation it heartbeats now; the generation then, or None if it did not start."""
        key = self._keys.cluster_generation

        def start(pipe: redis.client.Pipeline) -> None:
            current = Generation.from_hash(pipe.hgetall(key))
            if current is None or current.number != number or current.state != "forming":
                return
            ready = pipe.hgetall(self._keys.cluster_ready(number))
            if any(
                node not in beats or ready.get(node) != beats[node].incarnation
                for node in self.nodes
            ):
                return
            now = redis_time_ms(pipe)
            record = {**asdict(current), "state": "started", "started_ms": now}
            pipe.multi()
            pipe.hset(key, mapping={"state": "started", "started_ms": now})
            pipe.lpush(self._keys.cluster_history, json.dumps(record))
            pipe.ltrim(self._keys.cluster_history, 0, HISTORY_KEPT - 1)

        self._r.transaction(start, key)
        current = self.read()
        return current if current and current.number == number and current.started_ms else None

    def beat(self, beat: NodeBeat, ttl_s: float) -> None:
        """Publish a node's heartbeat; it expires after ``ttl_s`` without another."""
        self._r.set(self._keys.cluster_node(beat.node), beat.to_json(), px=int(ttl_s * 1000))

    def forget(self, node: str) -> None:
        """Withdraw a node's heartbeat (it is stopping)."""
        self._r.delete(self._keys.cluster_node(node))

    def beats(self) -> dict[str, NodeBeat]:
        """The heartbeats of the configured nodes alive now."""
        values = self._r.mget([self._keys.cluster_node(n) for n in self.nodes])
        return {n: NodeBeat.from_json(v) for n, v in zip(self.nodes, values, strict=True) if v}

    def history(self, limit: int = 10) -> list[dict[str, Any]]:
        """The generations that started, newest first."""
        return [json.loads(v) for v in self._r.lrange(self._keys.cluster_history, 0, limit - 1)]
