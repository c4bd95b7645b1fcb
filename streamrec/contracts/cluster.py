"""What the node agents of ``streamrec cluster`` agree on and tell each other in Redis
(``trainers.hosts.generation``): the cluster's generation, each node's heartbeat, and the
history of generations that started (read by ``streamrec status``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrec.contracts.wire import Contract

GenerationState = Literal["forming", "started"]


class Generation(Contract):
    """A generation of the cluster: every member of every node restarted together."""

    number: int
    state: GenerationState
    cause: str  # why it began: "first start", "process death on node a: ...", ...
    by: str  # the node that began it
    at_ms: int  # Redis time when it began forming
    started_ms: int = 0  # Redis time when every node had joined; 0 while forming


class Member(Contract):
    """One live member process of a node: its role (PSERVER or TRAINER), pid and
    resident memory (a server's holds its share of the sparse table)."""

    role: str
    pid: int
    rss_bytes: int = 0


class NodeBeat(Contract):
    """What a node agent says of itself with each heartbeat."""

    node: str
    address: str
    incarnation: str  # one per agent process: a restarted node is a new one
    generation: int  # the generation its members run (or it waits for)
    state: str  # waiting | starting | running | stopping | isolated
    members: tuple[Member, ...] = Field(default_factory=tuple)
    host: str = ""
    ts_ms: int = 0


class WorkerBeat(Contract):
    """A cluster worker's heartbeat: what it is doing (``train <pass>: <stage>``, ``idle``)
    in which generation on which node; expires unless renewed."""

    rank: int
    pid: int
    node: str
    generation: int
    state: str
    ts: float  # epoch seconds


class RestoreNote(Contract):
    """What the cluster's first worker loaded at the start of a generation: the newest
    checkpoint of the chain (none: a fresh model), how many saves, in how many seconds."""

    generation: int
    checkpoint: str | None
    saves: int
    seconds: float
    at: float  # epoch seconds when it finished
