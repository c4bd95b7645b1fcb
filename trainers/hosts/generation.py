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

import redis

from streamrec.contracts.cluster import Generation, NodeBeat
from streamrec.redis_keys import RedisKeys
from trainers.control_plane import redis_time_ms

HISTORY_KEPT = 100


def _generation(raw: dict[str, str]) -> Generation | None:
    """The generation in its Redis hash (``gen``, ``state``, ...), or None before any."""
    if not raw:
        return None
    return Generation(
        number=int(raw["gen"]),
        state=raw["state"],  # type: ignore[arg-type]  # checked by the contract
        cause=raw.get("cause", ""),
        by=raw.get("by", ""),
        at_ms=int(raw.get("at_ms", 0)),
        started_ms=int(raw.get("started_ms", 0)),
    )


class GenerationStore:
    """The generation keys of one pipeline's cluster, for the nodes named in the config."""

    def __init__(self, r: redis.Redis, keys: RedisKeys, nodes: list[str]) -> None:
        self._r = r
        self._keys = keys
        self.nodes = nodes

    def read(self) -> Generation | None:
        return _generation(self._r.hgetall(self._keys.cluster_generation))

    def bump(self, expected: int | None, cause: str, by: str) -> Generation:
        """Begin generation ``expected + 1`` (forming), unless the counter has moved past
        ``expected`` already (another node saw the trouble first); the current one."""
        key = self._keys.cluster_generation

        def begin(pipe: redis.client.Pipeline) -> None:
            current = _generation(pipe.hgetall(key))
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
            current = _generation(pipe.hgetall(key))
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
            current = _generation(pipe.hgetall(key))
            if current is None or current.number != number or current.state != "forming":
                return
            ready = pipe.hgetall(self._keys.cluster_ready(number))
            if any(
                node not in beats or ready.get(node) != beats[node].incarnation
                for node in self.nodes
            ):
                return
            now = redis_time_ms(pipe)
            record = current.model_copy(update={"state": "started", "started_ms": now})
            pipe.multi()
            pipe.hset(key, mapping={"state": "started", "started_ms": now})
            pipe.lpush(self._keys.cluster_history, record.to_json())
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
        return {
            n: NodeBeat.from_wire(v, self._keys.cluster_node(n))
            for n, v in zip(self.nodes, values, strict=True)
            if v
        }

    def history(self, limit: int = 10) -> list[Generation]:
        """The generations that started, newest first."""
        key = self._keys.cluster_history
        return [Generation.from_wire(v, key) for v in self._r.lrange(key, 0, limit - 1)]
