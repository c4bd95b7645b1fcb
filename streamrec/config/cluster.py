"""Where the cluster runs and keeps its files: paths, nodes, the cluster and its
checkpoints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from streamrec.config.base import _Strict


class PathConfig(_Strict):
    data_root: Path = Field(description="Root of pass directories (<data_root>/passes/...).")
    checkpoint_root: Path = Field(description="Root of cluster checkpoints.")
    model_root: Path = Field(description="Root of versioned inference artifacts.")
    work_root: Path = Field(description="Scratch: raw exports, cluster logs, resolved configs.")

    @classmethod
    def under(cls, root: Path) -> PathConfig:
        """Every directory under ``root``, laid out as the shipped config lays out var/."""
        root = Path(root)
        return cls(
            data_root=root / "data",
            checkpoint_root=root / "checkpoints",
            model_root=root / "models",
            work_root=root / "run",
        )


_DNS_NAME = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
)


class NodeConfig(_Strict):
    """One host of a cluster spread over several: what ``streamrec cluster`` runs there."""

    name: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        description="The node's name, as 'streamrec cluster --node NAME' takes it.",
    )
    address: str = Field(
        description="How the other hosts reach this one: an IPv4 address or a DNS name (a "
        "StatefulSet pod's stable name, a compose service); names are resolved when each "
        "generation starts, and its servers and workers listen at the address."
    )
    server_ports: list[int] = Field(
        default_factory=list,
        description="Ports of the parameter servers this host runs, one a server.",
    )
    worker_ports: list[int] = Field(
        default_factory=list,
        description="Ports of the trainer workers this host runs, one a worker.",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        import ipaddress

        try:
            ipaddress.IPv4Address(v)
            return v
        except ValueError:
            pass
        if not _DNS_NAME.fullmatch(v):
            raise ValueError("must be an IPv4 address or a DNS name (lower case)")
        return v

    @field_validator("server_ports", "worker_ports")
    @classmethod
    def _ports(cls, v: list[int]) -> list[int]:
        if any(not 0 < p < 65536 for p in v):
            raise ValueError("ports must be between 1 and 65535")
        return v


class ClusterConfig(_Strict):
    servers: int = Field(
        1, ge=1, description="Parameter servers (derived from cluster.nodes when it is set)."
    )
    workers: int = Field(
        2, ge=1, description="Trainer workers (derived from cluster.nodes when it is set)."
    )
    nodes: list[NodeConfig] = Field(
        default_factory=list,
        description="The hosts of a cluster spread over several, each running "
        "'streamrec cluster' (empty: one host, every member on loopback).",
    )
    rendezvous_port: int = Field(
        36001,
        gt=0,
        lt=65536,
        description="Port of the collectives' rendezvous (gloo's HTTP store), on the first "
        "server's host (cluster.nodes only).",
    )
    node_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="A node not heard from for this long is lost: the others stop their "
        "members and wait for it to start a new generation; a node that cannot reach Redis "
        "for this long stops its own members (cluster.nodes only).",
    )
    use_gpu: bool = Field(False, description="Train on GPU workers (needs paddlepaddle-gpu).")
    command_timeout_seconds: float = Field(
        900,
        gt=0,
        description="How long a caller waits for the cluster to finish one command. Keep it "
        "above the daily save of your table: about 6.4 s per million keys a server on a "
        "2-core host (bench/scale.py).",
    )
    start_timeout_seconds: float = Field(
        180, gt=0, description="How long the launcher waits for every worker's first heartbeat."
    )
    heartbeat_seconds: float = Field(2.0, gt=0, description="Worker heartbeat period.")
    redis_outage_seconds: float = Field(
        60.0,
        ge=0,
        description="How long workers keep retrying Redis when it goes away (a restart); "
        "past it they fail, and the cluster restarts from its checkpoints once Redis is back.",
    )
    follow_passes: bool = Field(
        True,
        description="The cluster trains each pass the moment it is complete, judges it and "
        "delivers it off the training path (ops/pass_follower.py); the Airflow DAG then "
        "watches each pass instead of driving it. Off: each DAG run drives its pass, a "
        "task per step, about 5 s later per pass (docs/decisions/).",
    )
    stop_grace_seconds: float = Field(
        20.0,
        gt=0,
        description="On SIGTERM or Ctrl-C, how long idle workers get to leave cleanly before "
        "the cluster's processes are killed (keep it under the service manager's own grace).",
    )

    @model_validator(mode="before")
    @classmethod
    def _counts_from_nodes(cls, data: Any) -> Any:
        """With ``nodes``, the server and worker counts are theirs; a count given beside
        them must agree."""
        if not isinstance(data, dict) or not data.get("nodes"):
            return data
        nodes = [n if isinstance(n, dict) else n.model_dump() for n in data["nodes"]]
        counts = {
            k: sum(len(n.get(f"{k[:-1]}_ports") or []) for n in nodes)
            for k in ("servers", "workers")
        }
        if not all(counts.values()):
            raise ValueError("cluster.nodes must list at least one server and one worker")
        for key, count in counts.items():
            if key in data and data[key] != count:
                raise ValueError(
                    f"cluster.{key} is {data[key]} but cluster.nodes list {count}: "
                    f"remove cluster.{key} (the nodes decide it) or make them agree"
                )
        return {**data, **counts}

    @model_validator(mode="after")
    def _nodes_consistent(self) -> ClusterConfig:
        if not self.nodes:
            return self
        names = [n.name for n in self.nodes]
        addresses = [n.address for n in self.nodes]
        for what, values in (("name", names), ("address", addresses)):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(
                    f"two nodes share the {what} {twice[0]}: Paddle tells nodes apart by "
                    "address, so give each host one node entry"
                )
        for node in self.nodes:
            ports = node.server_ports + node.worker_ports
            if len(set(ports)) != len(ports):
                raise ValueError(f"node {node.name}: a port is listed twice")
        first = self._first_server()
        for node in self.nodes:
            if (
                node.address == first
                and self.rendezvous_port in node.server_ports + node.worker_ports
            ):
                raise ValueError(
                    f"cluster.rendezvous_port {self.rendezvous_port} is also a member's port "
                    f"on node {node.name}: choose another"
                )
        return self

    def _first_server(self) -> str:
        return next(n.address for n in self.nodes if n.server_ports)


class CheckpointConfig(_Strict):
    base_every_passes: int = Field(
        6, ge=1, description="A full (base) checkpoint every N passes; deltas in between."
    )
    keep_bases: int = Field(
        3, ge=1, description="Complete bases kept (with their deltas); older ones are deleted."
    )
    warm_start: Path | None = Field(
        None,
        description="A fresh cluster starts from this model instead of from random: another "
        "pipeline's checkpoint root, one of its saves, or a directory Paddle's parameter "
        "server saved (fleet.save_persistables); relative to this file. It must fit the "
        "configured schema, tables and network (checked at start). Ignored once this "
        "pipeline has a checkpoint of its own.",
    )
