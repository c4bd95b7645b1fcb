"""``streamrec cluster``: run this host's part of the parameter-server cluster, until Ctrl-C.

    streamrec cluster --config C                 # one host: every member on loopback
    streamrec cluster --config C [--node NAME]   # on each host of cluster.nodes
    streamrec cluster --config C --warm-start P  # a fresh model from another's (warm_start)

Every host runs the same command; its node agent (``trainers.hosts.node_agent``) starts that
host's servers and workers with fleetrun and restarts them with every other host's when
anything is lost. ``LocalCluster`` is the in-process form of a one-host cluster that the
demo, the benchmarks and the tests drive directly: they restart it with ``ensure_healthy``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import psutil

from streamrec.config import PipelineConfig, derived, dump_config, load_config
from streamrec.entry import run_command
from streamrec.layout import Layout
from streamrec.redis_conn import require_credentials
from streamrec.signals import ignore_stop_signals
from trainers.control_plane import ClusterClient
from trainers.hosts.node_processes import NodeProcesses, stop_gracefully, wait_for_workers
from trainers.hosts.topology import LOCAL_NODE, Role, Topology, detect_node, local_addresses
from trainers.network_check import check_network
from trainers.worker.devices import check_device

log = logging.getLogger(__name__)


class LocalCluster:
    """A cluster whose every member runs on this host, on loopback: ``cluster.servers``
    servers and ``cluster.workers`` workers, on free ports picked at each start."""

    def __init__(self, cfg: PipelineConfig, config_path: Path) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path).resolve()
        self.log_dir = Layout.of(cfg.paths).cluster_logs
        self.client = ClusterClient.from_config(cfg)
        self._processes: NodeProcesses | None = None
        self._network_checked = False

    def start(self) -> None:
        """Launch servers and workers and wait until every worker sends a heartbeat."""
        check_device(self.cfg.cluster.use_gpu)
        if not self._network_checked:
            check_network(self.config_path)
            self._network_checked = True
        c = self.cfg.cluster
        topology = Topology.loopback(c.servers, c.workers)
        self._processes = NodeProcesses(self.config_path, topology, LOCAL_NODE, self.log_dir)
        self._processes.start(started_ms=self.client.now_ms())
        wait_for_workers(self._processes, self.client, c.workers, c.start_timeout_seconds)

    @property
    def running(self) -> bool:
        return self._processes is not None and self._processes.running

    def members(self, role: Role | None = None) -> list[psutil.Process]:
        """The live server and worker processes; with ``role``, only those fleetrun started
        as it (``PSERVER`` or ``TRAINER``)."""
        return self._processes.members(role) if self._processes is not None else []

    @property
    def healthy(self) -> bool:
        """Every server and worker process is alive."""
        return len(self.members()) == self.cfg.cluster.servers + self.cfg.cluster.workers

    def restart(self) -> None:
        """Kill every process and start again: the workers restore the newest complete
        checkpoint chain and re-run the command that was in flight (its cursor did not move)."""
        log.warning("restarting the cluster")
        self.kill()
        self.start()

    def ensure_healthy(self) -> bool:
        """Restart the cluster if any of its processes died; True if it did."""
        if self.healthy:
            return False
        log.error(
            "cluster process lost: %d of %d alive; see %s",
            len(self.members()),
            self.cfg.cluster.servers + self.cfg.cluster.workers,
            self.log_dir,
        )
        self.restart()
        return True

    def stop(self, timeout_s: float = 60) -> None:
        """Stop within about ``timeout_s`` (``stop_gracefully``)."""
        if self._processes is not None:
            c = self.cfg.cluster
            stop_gracefully(self._processes, self.client, c.heartbeat_seconds, timeout_s)

    def kill(self) -> None:
        """Kill fleetrun and every process it started."""
        if self._processes is not None:
            self._processes.kill()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_node(cfg: PipelineConfig, node: str) -> int:
    """0 when ``node``'s agent heartbeats with its members running, else 1 (a readiness or
    health probe); the state it reports is printed."""
    import redis

    from streamrec.redis_conn import connect
    from streamrec.redis_keys import RedisKeys
    from trainers.hosts.generation import GenerationStore

    try:
        store = GenerationStore(connect(cfg.redis, timeout_s=5), RedisKeys(cfg.name), [node])
        beat = store.beats().get(node)
    except redis.RedisError as e:
        print(f"node {node}: Redis does not answer ({e})")
        return 1
    print(f"node {node}: {beat.state if beat else 'no heartbeat'}")
    return 0 if beat is not None and beat.state == "running" else 1


Beside = Callable[[PipelineConfig, str], AbstractContextManager[None]]


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the CLI reference is generated from them)."""
    parser = argparse.ArgumentParser(
        prog="streamrec cluster",
        description="Run this host's servers and workers of the parameter-server cluster "
        "until Ctrl-C or SIGTERM; with cluster.nodes, run it on every host.",
    )
    parser.add_argument(
        "--config", required=True, type=Path, help="pipeline YAML with real addresses"
    )
    parser.add_argument(
        "--node",
        help="which of cluster.nodes this host is (default: the node at one of its addresses)",
    )
    parser.add_argument(
        "--warm-start",
        type=Path,
        metavar="PATH",
        help="start a fresh cluster from this model (checkpoints.warm_start): another "
        "pipeline's checkpoint root or save, or a directory Paddle's PS saved",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="a probe: exit 0 if this node's agent heartbeats with its members running",
    )
    return parser


def main(argv: list[str] | None = None, beside: Beside | None = None) -> int:
    """``streamrec cluster``; ``beside(cfg, node)`` runs around this host's node agent (the
    pass follower, which ``ops`` composes: ``ops.cluster_command``)."""
    cli = parser()
    args = cli.parse_args(argv)
    return run_command(lambda: _run(cli, args, beside))


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, beside: Beside | None) -> int:
    from trainers.hosts.node_agent import NodeAgent

    cfg = load_config(args.config)
    if args.warm_start is not None:
        warm = {"warm_start": str(args.warm_start.resolve())}
        cfg = derived(cfg, "--warm-start", checkpoints=warm)
    if cfg.uses_embedded_services:
        parser.error("the config says 'embedded': give real Kafka/Redis addresses")
    topology = Topology.from_config(cfg.cluster)
    node = topology.node(args.node).name if args.node else detect_node(topology, local_addresses())
    if args.check:
        return check_node(cfg, node)
    check_device(cfg.cluster.use_gpu)
    work = Path(cfg.paths.work_root)
    resolved = dump_config(cfg, work / f"cluster.{node}.resolved.yaml")
    check_network(resolved)  # the config whole before any service: a bad one is exit 2
    require_credentials(cfg.redis)  # before fleetrun: its workers would fail one by one
    agent = NodeAgent(cfg, resolved, topology, node)
    try:
        with beside(cfg, node) if beside else nullcontext():
            agent.run()
    finally:
        ignore_stop_signals()
    return 0


if __name__ == "__main__":
    sys.exit(main())
