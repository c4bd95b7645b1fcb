"""Where each server and worker of the cluster runs: the hosts (nodes), their addresses and
ports, and the fleetrun arguments that start one node's share.

Paddle's own multi-node launch is ``fleetrun --servers <all> --workers <all>`` run on every
host; fleetrun starts the members whose address is its node's (``POD_IP``, else the
address of the host name) and numbers ranks by node order. A config without
``cluster.nodes`` is one node on loopback whose ports are picked free at every start, as
the single-host cluster always was. Pure logic, apart from reading this host's addresses.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

from streamrec.config import ClusterConfig, NodeConfig
from streamrec.errors import ConfigError, ServiceError
from streamrec.ports import free_port

Role = Literal["PSERVER", "TRAINER"]
ROLE_ENV = "TRAINING_ROLE"  # where fleetrun tells each member its Role
LOCAL_NODE = "local"


@dataclass(frozen=True)
class Topology:
    """Every node of one cluster, in config order, and the rendezvous port."""

    nodes: tuple[NodeConfig, ...]
    rendezvous_port: int

    @classmethod
    def from_config(cls, cluster: ClusterConfig) -> Topology:
        """The configured nodes, or one loopback node on free ports (pick again per start)."""
        if cluster.nodes:
            return cls(tuple(cluster.nodes), cluster.rendezvous_port)
        return cls.loopback(cluster.servers, cluster.workers)

    @classmethod
    def loopback(cls, servers: int, workers: int) -> Topology:
        """One node on 127.0.0.1 with ``servers`` and ``workers`` on free ports."""
        node = NodeConfig(
            name=LOCAL_NODE,
            address="127.0.0.1",
            server_ports=[free_port() for _ in range(servers)],
            worker_ports=[free_port() for _ in range(workers)],
        )
        return cls((node,), free_port())

    def resolved(self) -> Topology:
        """The same nodes at the IPv4 addresses their names resolve to now (fleetrun tells
        nodes apart by address; a pod that came back may have a new one). ServiceError if a
        name does not resolve yet, ConfigError if two nodes resolve to one address."""
        nodes = []
        for node in self.nodes:
            try:
                address = socket.gethostbyname(node.address)
            except OSError as e:
                raise ServiceError(f"node {node.name}: {node.address} does not resolve: {e}") from e
            nodes.append(node.model_copy(update={"address": address}))
        addresses = [n.address for n in nodes]
        if len(set(addresses)) != len(addresses):
            raise ConfigError(
                f"cluster.nodes resolve to {addresses}: two nodes at one address cannot be "
                "told apart (Paddle compares nodes by address)"
            )
        return Topology(tuple(nodes), self.rendezvous_port)

    @property
    def single_host(self) -> bool:
        return len(self.nodes) == 1

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> NodeConfig:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(
            f"--node {name}: cluster.nodes has no node of that name (it has {self.names})"
        )

    @property
    def server_endpoints(self) -> str:
        return ",".join(f"{n.address}:{p}" for n in self.nodes for p in n.server_ports)

    @property
    def worker_endpoints(self) -> str:
        return ",".join(f"{n.address}:{p}" for n in self.nodes for p in n.worker_ports)

    @property
    def rendezvous_host(self) -> str:
        """Gloo's HTTP store runs beside server 0, on the first node with a server."""
        return next(n.address for n in self.nodes if n.server_ports)

    def fleetrun_args(self) -> list[str]:
        """The same on every node: the whole cluster; fleetrun starts its own node's part."""
        return [
            *("--servers", self.server_endpoints),
            *("--workers", self.worker_endpoints),
            *("--http_port", str(self.rendezvous_port)),
        ]


def local_addresses() -> set[str]:
    """The IPv4 addresses of this host's interfaces."""
    import psutil

    return {
        a.address
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family == socket.AF_INET
    }


def detect_node(topology: Topology, addresses: set[str]) -> str:
    """The one node whose address is among ``addresses``; ConfigError when none or several
    are (the operator gives ``--node``)."""
    if topology.single_host and topology.nodes[0].name == LOCAL_NODE:
        return LOCAL_NODE
    mine = [n.name for n in topology.nodes if _resolve(n.address) in addresses]
    if len(mine) == 1:
        return mine[0]
    found = "none" if not mine else ", ".join(mine)
    raise ConfigError(
        f"cannot tell which of cluster.nodes this host is (nodes at this host's addresses "
        f"{sorted(addresses)}: {found}): start it with 'streamrec cluster --node NAME'"
    )


def _resolve(address: str) -> str | None:
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


def check_host_name(node: NodeConfig, topology: Topology) -> None:
    """Workers meet in Paddle's gloo collectives at the address their host name resolves
    to; on several hosts it must be the node's own, else the others cannot connect."""
    if topology.single_host or not node.worker_ports:
        return
    name = socket.gethostname()
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)}
    except OSError:
        resolved = set()
    if _resolve(node.address) not in resolved:
        raise ConfigError(
            f"cluster.nodes[{node.name}].address is {node.address}, but this host's name "
            f"{name!r} resolves to {sorted(resolved) or 'nothing'}: Paddle's collectives "
            f"(gloo) reach a worker at the address of its host name, so workers elsewhere "
            f"could not reach this one. Map {name!r} to {node.address} (/etc/hosts or DNS)"
        )
