"""cluster.nodes: what the config accepts, the fleetrun arguments every host runs, and how a
host finds its own node."""

from __future__ import annotations

import socket

import pytest

from streamrec.config import ClusterConfig
from streamrec.errors import ConfigError, ServiceError
from trainers.hosts.topology import LOCAL_NODE, Topology, check_host_name, detect_node

NODES = [
    {"name": "ps-0", "address": "10.0.0.11", "server_ports": [36000]},
    {"name": "mixed", "address": "10.0.0.12", "server_ports": [36000], "worker_ports": [36100]},
    {"name": "trainer-0", "address": "10.0.0.13", "worker_ports": [36100, 36101]},
]


def test_nodes_decide_the_counts_and_the_endpoints() -> None:
    cluster = ClusterConfig.model_validate({"nodes": NODES, "rendezvous_port": 36999})
    assert (cluster.servers, cluster.workers) == (2, 3)
    topology = Topology.from_config(cluster)
    assert topology.server_endpoints == "10.0.0.11:36000,10.0.0.12:36000"
    assert topology.worker_endpoints == "10.0.0.12:36100,10.0.0.13:36100,10.0.0.13:36101"
    assert topology.rendezvous_host == "10.0.0.11"
    assert topology.fleetrun_args() == [
        *("--servers", "10.0.0.11:36000,10.0.0.12:36000"),
        *("--workers", "10.0.0.12:36100,10.0.0.13:36100,10.0.0.13:36101"),
        *("--http_port", "36999"),
    ]
    assert not topology.single_host
    assert topology.node("mixed").address == "10.0.0.12"


@pytest.mark.parametrize(
    ("cluster", "says"),
    [
        ({"servers": 3, "nodes": NODES}, "cluster.servers is 3 but cluster.nodes list 2"),
        ({"nodes": [*NODES, {**NODES[0], "name": "again"}]}, "share the address 10.0.0.11"),
        ({"nodes": [*NODES, {**NODES[2], "address": "10.0.0.14"}]}, "share the name trainer-0"),
        ({"nodes": [NODES[0]]}, "at least one server and one worker"),
        ({"nodes": [{**NODES[1], "worker_ports": [36000]}]}, "a port is listed twice"),
        ({"nodes": NODES, "rendezvous_port": 36000}, "rendezvous_port 36000 is also a member"),
        ({"nodes": [{**NODES[1], "address": "PS_0.internal"}]}, "IPv4 address or a DNS name"),
        ({"nodes": [{**NODES[1], "name": "Bad_Name"}]}, "should match pattern"),
    ],
)
def test_bad_nodes_are_refused_with_the_reason(cluster: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ClusterConfig.model_validate(cluster)


def test_without_nodes_one_loopback_node_on_fresh_ports() -> None:
    cluster = ClusterConfig(servers=2, workers=2)
    first, second = Topology.from_config(cluster), Topology.from_config(cluster)
    assert first.single_host and first.names == [LOCAL_NODE]
    assert first.server_endpoints.count("127.0.0.1:") == 2
    assert first.fleetrun_args() != second.fleetrun_args()  # picked again at each start
    assert detect_node(first, set()) == LOCAL_NODE


def test_names_resolve_to_addresses_for_each_generation() -> None:
    named = [{**NODES[0], "address": "localhost"}, {**NODES[2], "address": "10.0.0.13"}]
    topology = Topology.from_config(ClusterConfig.model_validate({"nodes": named}))
    assert topology.node("ps-0").address == "localhost"
    assert [n.address for n in topology.resolved().nodes] == ["127.0.0.1", "10.0.0.13"]
    assert detect_node(topology, {"127.0.0.1"}) == "ps-0"
    twice = [{**NODES[0], "address": "localhost"}, {**NODES[2], "address": "127.0.0.1"}]
    with pytest.raises(ConfigError, match="two nodes at one address"):
        Topology.from_config(ClusterConfig.model_validate({"nodes": twice})).resolved()
    missing = [{**NODES[0], "address": "no-such-host.invalid"}, NODES[2]]
    with pytest.raises(ServiceError, match=r"no-such-host\.invalid does not resolve"):
        Topology.from_config(ClusterConfig.model_validate({"nodes": missing})).resolved()


def test_a_host_finds_its_node_by_its_addresses() -> None:
    topology = Topology.from_config(ClusterConfig.model_validate({"nodes": NODES}))
    assert detect_node(topology, {"127.0.0.1", "10.0.0.13"}) == "trainer-0"
    with pytest.raises(ConfigError, match="--node NAME"):
        detect_node(topology, {"127.0.0.1", "192.0.2.7"})
    with pytest.raises(ConfigError, match="ps-0, mixed"):  # one host holding two addresses
        detect_node(topology, {"10.0.0.11", "10.0.0.12"})
    with pytest.raises(ConfigError, match="has no node of that name"):
        topology.node("ps-9")


def test_a_worker_host_whose_name_resolves_elsewhere_is_refused() -> None:
    """gloo reaches a worker at its host name's address; this machine's name does not
    resolve to 10.0.0.13, so a worker node there is refused, a server-only one is not."""
    topology = Topology.from_config(ClusterConfig.model_validate({"nodes": NODES}))
    assert "10.0.0.13" not in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    with pytest.raises(ConfigError, match=r"cluster.nodes\[trainer-0\].address is 10.0.0.13"):
        check_host_name(topology.node("trainer-0"), topology)
    check_host_name(topology.node("ps-0"), topology)
