"""The Redis control plane between callers (Airflow tasks, the demo) and the cluster.

Callers append commands to one stream; every worker reads every command in order, runs it
together with the others and acknowledges it. The cluster has one cursor, which worker 0
moves in the transaction that records the command's outcome, and every worker reads the
next command only after that (a barrier): a kill at any moment leaves every worker of the
next start on the same command, which is the collectives' premise (per-worker cursors let a
kill between two workers' moves start them on different commands, whose all-reduces then
paired with each other and hung the cluster). A command whose
``done:<kind>:<pass_id>`` marker exists is acknowledged with the stored result and not run
again, so a retried task never trains a pass twice. Key names: ``streamrec.redis_keys``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import redis

from streamrec.config import PipelineConfig
from streamrec.contracts.cluster import RestoreNote, WorkerBeat
from streamrec.contracts.pass_status import CONTRACT, PassField, PassStatus, read_status, record
from streamrec.contracts.training import (
    ExportReply,
    MaintainReply,
    Repeat,
    ScoreReply,
    StepsReply,
    TrainResult,
)
from streamrec.errors import ContractError
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import ACK_FIELD, RESULT_FIELD, RedisKeys, worker_results
from streamrec.waiting import poll_until
from trainers.errors import ClusterUnavailable, CommandFailed, CommandTimeout

log = logging.getLogger(__name__)

CommandKind = Literal["train", "train_steps", "maintain", "export", "score", "stop"]
RESTARTABLE: tuple[CommandKind, ...] = ("train", "maintain")  # undone past a restored save
# run every time: no done marker (a step's training lives in the workers' memory until its
# pass is saved: a restarted cluster has none of it)
UNMARKED: tuple[CommandKind, ...] = ("train_steps", "score", "stop")
WORKER = "worker"
# a waiting client looks for the command's result every DONE_POLL_S (a small pass's train
# and export commands take 0.1-1 s; at 50 ms each wait added 25 ms on average to a pass's
# path to serving) and at the workers' heartbeats (a scan of their keys) every
# LIVENESS_EVERY_S: a cluster gone is judged over seconds, not milliseconds
DONE_POLL_S, LIVENESS_EVERY_S = 0.01, 0.5
# in every member's environment: Redis time (ms) when this run of the cluster started, the
# cluster generation it belongs to, and the node (host) it runs on
STARTED_ENV = "STREAMREC_CLUSTER_STARTED_MS"
GENERATION_ENV = "STREAMREC_CLUSTER_GENERATION"
NODE_ENV = "STREAMREC_CLUSTER_NODE"


def redis_time_ms(r: redis.Redis) -> int:
    """The Redis server's clock in milliseconds, the clock stream ids are made from."""
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


@dataclass(frozen=True)
class Command:
    """One cluster command as stored in the stream."""

    id: str
    kind: CommandKind
    pass_id: str
    stream_id: str = ""
    steps: tuple[str, ...] = ()  # train_steps: "<partition>/<step>" of the pass

    @classmethod
    def from_fields(cls, stream_id: str, fields: dict[str, str]) -> Command:
        steps = tuple(s for s in fields.get("steps", "").split(",") if s)
        kind: Any = fields["kind"]
        return cls(fields["id"], kind, fields.get("pass_id", ""), stream_id, steps)


class ClusterClient:
    """Submits commands and waits for their results."""

    def __init__(
        self, r: redis.Redis, keys: RedisKeys, timeout_s: float, heartbeat_s: float
    ) -> None:
        self._r = r
        self._keys = keys
        self._timeout = timeout_s
        self._heartbeat = heartbeat_s

    @classmethod
    def from_config(cls, cfg: PipelineConfig) -> ClusterClient:
        return cls(
            connect(cfg.redis),
            RedisKeys(cfg.name),
            cfg.cluster.command_timeout_seconds,
            cfg.cluster.heartbeat_seconds,
        )

    def submit(self, kind: CommandKind, pass_id: str = "", steps: tuple[str, ...] = ()) -> str:
        """Append a command; return its id."""
        command_id = uuid.uuid4().hex[:12]
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(
            self._keys.command(command_id),
            mapping={"kind": kind, "pass_id": pass_id, "status": "queued"},
        )
        fields = {"id": command_id, "kind": kind, "pass_id": pass_id}
        if steps:
            fields["steps"] = ",".join(steps)
        pipe.xadd(self._keys.commands, fields)
        pipe.execute()
        return command_id

    def now_ms(self) -> int:
        """Redis time in milliseconds (see ``STARTED_ENV``)."""
        return redis_time_ms(self._r)

    def live_workers(self) -> list[WorkerBeat]:
        """Heartbeats of the workers alive now."""
        keys = list(scan_keys(self._r, self._keys.heartbeat_pattern(WORKER)))
        beats = self._r.mget(keys) if keys else []
        return [WorkerBeat.from_wire(v, k) for k, v in zip(keys, beats, strict=True) if v]

    def wait(self, command_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Block until the command is done; its result. Raises on failure or timeout."""
        no_worker_since: float | None = None  # since when no worker has sent a heartbeat
        looked = 0.0  # when the workers' heartbeats were last looked at

        def result() -> dict[str, Any] | None:
            nonlocal no_worker_since, looked
            state = self._r.hgetall(self._keys.command(command_id))
            if state.get("status") == "done":
                return json.loads(state.get("result") or "{}")
            if state.get("status") == "failed":
                raise CommandFailed(
                    f"command {command_id} ({state.get('kind')} {state.get('pass_id')}) "
                    f"failed on the cluster: {state.get('error')}"
                )
            if time.monotonic() - looked < LIVENESS_EVERY_S:
                return None
            looked = time.monotonic()
            if self.live_workers() or self._restarting():
                no_worker_since = None
                return None
            if no_worker_since is None:
                no_worker_since = time.monotonic()
            grace = 5 * self._heartbeat + 10
            if time.monotonic() - no_worker_since > grace:
                raise ClusterUnavailable(
                    f"no trainer worker has sent a heartbeat for {grace:.0f}s; "
                    "is the cluster running? (streamrec cluster --config ...)"
                )
            return None

        done = poll_until(result, timeout_s or self._timeout, DONE_POLL_S)
        if done is None:
            raise CommandTimeout(f"command {command_id} did not finish within the timeout")
        return done

    def _restarting(self) -> bool:
        """The node agents are forming a new generation of the cluster: its workers are
        down on purpose, and the command in flight runs once they are back."""
        return self._r.hget(self._keys.cluster_generation, "state") == "forming"

    def run(
        self, kind: CommandKind, pass_id: str = "", timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Submit a command and wait for its result; a marked command that is done already
        (another caller ran it) returns its stored result without joining the queue."""
        if kind not in UNMARKED and (stored := self.stored_result(kind, pass_id)) is not None:
            return {**stored, "already_done": True}
        command_id = self.submit(kind, pass_id)
        log.info("cluster command %s %s %s submitted", command_id, kind, pass_id)
        return self.wait(command_id, timeout_s)

    def train(self, pass_id: str) -> TrainResult:
        """Progressive validation then training on ``pass_id``; what it measured and saved
        (ContractError when the reply breaks ``TrainResult``)."""
        return TrainResult.from_wire(self.run("train", pass_id), f"train {pass_id}")

    def train_steps(self, pass_id: str, steps: tuple[str, ...]) -> StepsReply:
        """Score then train the published ``steps`` of the open pass ``pass_id`` (each
        ``"<partition>/<step>"``) that the workers have not trained yet; nothing is saved."""
        command_id = self.submit("train_steps", pass_id, steps)
        self.wait(command_id)
        results = worker_results(self._r.hgetall(self._keys.command(command_id)))
        return StepsReply.from_wire(results[min(results)], f"train_steps {pass_id}")

    def maintain(self, pass_id: str) -> MaintainReply:
        """The daily shrink and mode-3 save after ``pass_id``, the last pass of its day."""
        return MaintainReply.from_wire(self.run("maintain", pass_id), f"maintain {pass_id}")

    def export(self, pass_id: str) -> ExportReply:
        """Write the raw inference export after ``pass_id``."""
        return ExportReply.from_wire(self.run("export", pass_id), f"export {pass_id}")

    def score(self, pass_id: str) -> list[ScoreReply]:
        """The model's predictions for every row of ``pass_id``, without training on it:
        one result per worker, in rank order (see ``pass_steps.score``)."""
        command_id = self.submit("score", pass_id)
        self.wait(command_id)
        results = worker_results(self._r.hgetall(self._keys.command(command_id)))
        return [ScoreReply.from_wire(results[rank], f"score {pass_id}") for rank in sorted(results)]

    def stop(self, timeout_s: float = 60) -> None:
        """Ask every worker to leave its loop."""
        self.run("stop", timeout_s=timeout_s)

    def stored_result(self, kind: CommandKind, pass_id: str) -> dict[str, Any] | None:
        """The result of the command that completed ``kind`` on the pass, or None."""
        command_id = self._r.get(self._keys.done(kind, pass_id))
        if command_id is None:
            return None
        raw = self._r.hget(self._keys.command(command_id), "result")
        return json.loads(raw) if raw else None

    def worker_results(self, kind: CommandKind, pass_id: str) -> dict[int, dict[str, Any]]:
        """What each worker computed for the command that completed ``kind`` on the pass."""
        command_id = self._r.get(self._keys.done(kind, pass_id))
        if command_id is None:
            return {}
        results = worker_results(self._r.hgetall(self._keys.command(command_id)))
        return {rank: json.loads(result) for rank, result in results.items()}

    def pass_status(self, pass_id: str) -> PassStatus:
        """What has happened to the pass so far."""
        return read_status(self._r, self._keys, pass_id)


class WorkerChannel:
    """A worker's side of the control plane: read commands in order, report, heartbeat."""

    def __init__(
        self, r: redis.Redis, keys: RedisKeys, rank: int, heartbeat_s: float, started_ms: int = 0
    ) -> None:
        self._r = r
        self._keys = keys
        self.rank = rank
        self.started_ms = started_ms  # when the launcher started this cluster (Redis time)
        self._heartbeat_s = heartbeat_s
        self._state = self._command_state = "starting"
        self._hold_until = 0.0  # monotonic time until which heartbeats must live
        self._stop = threading.Event()
        # one publish at a time: the heartbeat thread's SET of the state it read before a
        # stage change could otherwise land after the new stage's SET and show the old
        # stage for as long as the new one blocks the thread (a CI run's kill harness
        # never saw a pass's train stage)
        self._publishing = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def start_heartbeat(self) -> None:
        self._thread.start()

    def set_state(self, state: str) -> None:
        """What the worker is doing, e.g. ``train 202601010000``; sent at once (a launcher
        stopping the cluster reads it) and with each heartbeat."""
        self._state = self._command_state = state
        self._hold_until = 0.0
        self._publish()

    def set_stage(self, stage: str, hold_s: float = 0.0) -> None:
        """The stage within the current command: ``train 202601010000: evaluate``; sent at
        once (a stage of a small pass can be shorter than a heartbeat period). ``hold_s``:
        the stage blocks this process's heartbeats (Paddle's save and shrink hold the GIL
        until they return), so this heartbeat lives that long."""
        self._state = f"{self._command_state}: {stage}"
        # every heartbeat of the stage keeps the hold: the thread's own beat just before
        # the call blocks must not shorten it
        self._hold_until = time.monotonic() + hold_s
        self._publish()

    def _publish(self) -> None:
        with self._publishing:
            if not self._stop.is_set():  # a beat after the stop would revive the key
                self._publish_now()

    def _publish_now(self) -> None:
        beat = WorkerBeat(
            rank=self.rank,
            pid=os.getpid(),
            node=os.environ.get(NODE_ENV, ""),
            generation=int(os.environ.get(GENERATION_ENV, "0")),
            state=self._state,
            ts=time.time(),
        )
        hold_s = self._hold_until - time.monotonic()
        ttl = max(1, int(3 * self._heartbeat_s + 1), math.ceil(hold_s))
        try:
            self._r.set(self._keys.heartbeat(WORKER, self.rank), beat.to_json(), ex=ttl)
        except redis.RedisError as e:
            log.warning("heartbeat failed: %s", e)

    def _beat(self) -> None:
        while not self._stop.is_set():
            self._publish()
            self._stop.wait(self._heartbeat_s)

    def note_restore(self, note: RestoreNote) -> None:
        """Keep what this generation restored, for ``streamrec status`` and the exporter."""
        self._r.set(self._keys.cluster_restore, note.to_json())

    def stop_heartbeat(self) -> None:
        with self._publishing:
            self._stop.set()
            self._r.delete(self._keys.heartbeat(WORKER, self.rank))

    def next_command(self, block_ms: int = 1000) -> Command | None:
        """The command after the cluster's cursor, or None when none arrives in time."""
        cursor = self._r.get(self._keys.cursor) or "0-0"
        reply = self._r.xread({self._keys.commands: cursor}, count=1, block=block_ms)
        if not reply:
            return None
        stream_id, fields = reply[0][1][0]
        return Command.from_fields(stream_id, fields)

    def stale_stop(self, command: Command) -> bool:
        """A ``stop`` sent to an earlier run of the cluster, which was killed before it
        read it (``LocalCluster.stop`` after its grace): this run must not obey it."""
        sent_ms = int(command.stream_id.split("-")[0]) if command.stream_id else 0
        return command.kind == "stop" and sent_ms < self.started_ms

    def is_done(self, command: Command) -> bool:
        return (
            command.kind not in UNMARKED
            and self._r.exists(self._keys.done(command.kind, command.pass_id)) == 1
        )

    def stored_result(self, command: Command) -> dict[str, Any]:
        """Result of the earlier command that completed the same kind and pass."""
        earlier = self._r.get(self._keys.done(command.kind, command.pass_id))
        raw = self._r.hget(self._keys.command(earlier), "result") if earlier else None
        return {**json.loads(raw or "{}"), "already_done": True}

    def acknowledge(self, command: Command, result: dict[str, Any] | None) -> None:
        """Record that this worker finished ``command`` and what it computed."""
        self._r.hset(
            self._keys.command(command.id),
            mapping={
                f"{ACK_FIELD}{self.rank}": str(time.time()),
                f"{RESULT_FIELD}{self.rank}": json.dumps(result),
            },
        )

    def record(self, command: Command, result: dict[str, Any] | None, error: str | None) -> None:
        """Leader only: the command's outcome, its done marker and the pass status, and the
        cluster's cursor past it, at once. A command found done in the restored model (its
        marker lost in a crash) gets both. A reply that breaks its contract is recorded as
        the command's failure, naming the field: the pass status only holds valid ones."""
        result = result or {}
        reply = None
        if error is None and command.kind not in UNMARKED:
            try:
                reply = CONTRACT[PassField(command.kind)].from_wire(
                    result, f"{command.kind} {command.pass_id}"
                )
            except ContractError as e:
                error = str(e)
        pipe = self._r.pipeline(transaction=True)
        key = self._keys.command(command.id)
        pipe.set(self._keys.cursor, command.stream_id)
        if error is not None:
            pipe.hset(key, mapping={"status": "failed", "error": error})
        else:
            pipe.hset(key, mapping={"status": "done", "result": json.dumps(result)})
        if isinstance(reply, Repeat) and (not reply.already_done or reply.already_in_model):
            first = not reply.already_done
            pipe.set(self._keys.done(command.kind, command.pass_id), command.id, nx=not first)
            record(pipe, self._keys, command.pass_id, PassField(command.kind), reply)
        if isinstance(reply, TrainResult):  # earlier passes it judged on their final labels
            for matured in reply.matured:
                record(pipe, self._keys, matured.pass_id, PassField.MATURED, matured)
        pipe.execute()

    def forget_done_after(self, pass_id: str) -> list[str]:
        """Leader only, at start: drop train/maintain done markers of passes after
        ``pass_id`` (the restored model's newest), so those passes are trained again."""
        dropped = []
        for kind in RESTARTABLE:
            for key in scan_keys(self._r, self._keys.done(kind, "*")):
                if self._keys.pass_of(key) > pass_id:
                    dropped.append(key)
        if dropped:
            self._r.delete(*dropped)
            log.warning("restored model predates %d done commands: %s", len(dropped), dropped)
        return dropped

    def skip(self, command: Command) -> None:
        """Leader only: move the cluster's cursor past ``command`` without running it."""
        self._r.set(self._keys.cursor, command.stream_id)
