"""Apache Kafka, installed and run by the project: the demo's and the tests' broker.

The broker is the ``org.apache.kafka:kafka_2.13`` jar and its runtime dependencies from
Maven Central, at ``KAFKA_VERSION``, copied once into a cache folder by Maven (which
verifies every jar's checksum: ``--strict-checksums``) and run on the JVM with the
JVM options here (``HEAP_OPTIONS``, ``PERFORMANCE_OPTIONS``): the version and the JVM's
settings live in this module only.
``start_kafka`` runs one KRaft node that is its own controller (no ZooKeeper): it writes the
node's properties, formats its storage, starts it, waits until it answers metadata requests
and hands back a ``RunningService`` whose ``stop`` shuts it down cleanly.
``start_kafka_cluster`` runs several such nodes as one replicated cluster (each a broker
and a voter), and ``restart_kafka_node`` starts one of them again on the storage it left.

    python -m devservices.kafka_broker install     # what scripts/setup.sh runs
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devservices.processes import PortTaken, RunningService, wait_until_answers
from streamrec.errors import ServiceError
from streamrec.ports import free_port

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.25.5"  # the log4j the broker's own dependencies name; its slf4j binding
CACHE_ENV = "STREAMREC_CACHE"
# A demo and test broker on a 2-core, 24 GiB machine, which starts a few dozen of them in a
# suite beside busy trainers: a 512 MiB heap (a node holds small topics; Kafka's own guide
# sizes production brokers at 6 GiB); the serial collector (no concurrent GC threads for a
# heap this size) and the C1 compiler only (C2's compiles cost CPU-seconds that a broker
# moving this little data never earns back), and the classes it loads at start read from a
# class-data archive made once at install, as apache/kafka's image does. Measured by
# bench/kafka_start.py against the G1 + C2 settings before them: docs/decisions/. As
# with Kafka's own scripts, KAFKA_HEAP_OPTS and KAFKA_JVM_PERFORMANCE_OPTS replace them.
HEAP_OPTIONS = ("-Xms256m", "-Xmx512m")
PERFORMANCE_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
HEAP_ENV, PERFORMANCE_ENV = "KAFKA_HEAP_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS"
# out of memory is an exit: a half-dead broker hangs its clients instead
FIXED_OPTIONS = ("-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
CLASS_ARCHIVE = "kafka.jsa"
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.streamrec</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""
_LOG_CONFIG = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.log
        level: WARN
      - name: org.apache.kafka.storage
        level: WARN
"""
_COMPLETE = ".complete"


def cache_root() -> Path:
    """Where installed brokers live: ``STREAMREC_CACHE``, else ``~/.cache/streamrec``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "streamrec")


def kafka_home() -> Path:
    """The folder of this version's jars (``libs/``) and its log configuration."""
    return cache_root() / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}"


def install_kafka() -> Path:
    """Install the pinned broker into the cache once (Maven resolves and verifies the jars);
    its home. Idempotent; a killed install leaves no home that looks complete."""
    home = kafka_home()
    if (home / _COMPLETE).is_file():
        _archive_classes(home)  # an install from before the archive gets one
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError("Maven is not installed: apt-get install -y maven (scripts/setup.sh)")
    staging = home.with_name(f".{home.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    pom = staging / "pom.xml"
    pom.write_text(_POM.format(scala=SCALA_VERSION, kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
    command = [
        mvn,
        "-B",
        "-q",
        "--strict-checksums",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging / 'libs'}",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = (done.stdout + done.stderr).strip().splitlines()[-10:]
        raise ServiceError(f"installing Apache Kafka {KAFKA_VERSION} failed: " + " | ".join(tail))
    (staging / "log4j2.yaml").write_text(_LOG_CONFIG)
    (staging / _COMPLETE).write_text(KAFKA_VERSION + "\n")
    shutil.rmtree(home, ignore_errors=True)
    staging.rename(home)
    log.info("Apache Kafka %s installed in %s", KAFKA_VERSION, home)
    _archive_classes(home)
    return home


def _archive_classes(home: Path) -> None:
    """The class-data archive of a broker's start (a dynamic CDS archive, written when a
    broker started here exits), once. It names the jars' paths, so it is made in the home
    itself, after the install; without it brokers start as before, only slower."""
    archive = home / CLASS_ARCHIVE
    if archive.is_file():
        return
    partial = archive.with_name(f".{CLASS_ARCHIVE}.tmp-{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            node = KafkaNode("127.0.0.1", (free_port(), free_port()))
            service = _launch(
                Path(scratch),
                1,
                [node],
                cluster_id(),
                {},
                120,
                (f"-XX:ArchiveClassesAtExit={partial}",),
            )
            try:
                _wait(service, node, {}, 120)
            finally:
                service.stop()
    except (ServiceError, OSError, subprocess.SubprocessError) as e:
        log.warning("no class-data archive for Kafka (brokers start without one): %s", e)
        return
    if partial.is_file():
        partial.rename(archive)


def installed_home() -> Path:
    """The installed broker's home; ServiceError naming the set-up when it is missing."""
    home = kafka_home()
    if not (home / _COMPLETE).is_file():
        raise ServiceError(
            f"Apache Kafka {KAFKA_VERSION} is not installed in {home.parent}: bash "
            "scripts/setup.sh installs it (python -m devservices.kafka_broker install)"
        )
    return home


def java() -> str:
    """The java launcher: ``JAVA_HOME``'s, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    found = str(candidate) if candidate and candidate.is_file() else shutil.which("java")
    if found is None:
        raise ServiceError(
            "Java is not installed: apt-get install -y openjdk-17-jre-headless (scripts/setup.sh)"
        )
    return found


def cluster_id() -> str:
    """A new KRaft cluster id: a UUID in URL-safe base64, never starting with ``-``, which
    the storage tool would read as an option (one id in 64 did: a suite run lost a test
    worker's broker, and its 58 tests, to one)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


@dataclass(frozen=True)
class KafkaNode:
    """Where one node of a cluster runs: its address, its ports (clients', controller's) and
    the command prefix that runs it there (``ip netns exec <ns> ...``; empty: here)."""

    host: str
    ports: tuple[int, int]
    prefix: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.ports[0]}"


def node_properties(
    node_id: int, nodes: Sequence[KafkaNode], data_dir: Path, extra: dict[str, str]
) -> dict[str, str]:
    """Node ``node_id`` (1-based) of ``nodes``, each a broker and a controller: one node is
    its own quorum; several replicate every topic to all of them (up to 3) and take writes
    while all but one are in sync. Internal topics get few partitions (quick to create)."""
    me = nodes[node_id - 1]
    host, (port, controller_port) = me.host, me.ports
    replicas = min(3, len(nodes))
    in_sync = max(1, replicas - 1)
    quorum = (
        {
            "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
            # a lone controller's no-op records (every 500 ms by default) only tell its own
            # broker the metadata log is live: 2.39 -> 1.77 CPU-s per idle 90 s (docs/decisions/)
            "metadata.max.idle.interval.ms": "5000",
        }
        if len(nodes) == 1
        else {
            "controller.quorum.voters": ",".join(
                f"{i}@{n.host}:{n.ports[1]}" for i, n in enumerate(nodes, 1)
            )
        }
    )
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        **quorum,
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(in_sync),
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(in_sync),
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(in_sync),
        "group.initial.rebalance.delay.ms": "0",
        # Retention counts from record timestamps: producers that stamp records with event
        # times months old (the tests' librdkafka ones) had their segments deleted by a 7-day
        # retention's 5-minute check between a test's produce and its read (the codec test).
        # Topics that need retention set their own (the dead-letter topics do).
        "log.retention.ms": "-1",
        **extra,
    }


def start_kafka(
    log_dir: Path,
    host: str = "127.0.0.1",
    ports: tuple[int, int] | None = None,
    prefix: Sequence[str] = (),
    extra: dict[str, str] | None = None,
    client: dict[str, Any] | None = None,
    timeout: float = 120,
) -> RunningService:
    """A single-node Apache Kafka on ``host``, its storage under ``log_dir``; ``ports``:
    (clients', controller's), free loopback ports when not given. ``prefix`` runs it
    elsewhere (``ip netns exec <ns> ...`` for a namespace host); ``extra``: broker
    properties over the node's own (listeners with security, say), and ``client``: the
    kafka-python settings that reach it then. Returns once it answers metadata requests."""
    extra, client = extra or {}, client or {}
    if ports is not None:
        node = KafkaNode(host, ports, tuple(prefix))
        return start_kafka_cluster(log_dir, [node], extra, client, timeout)[0]
    for _ in range(2):
        try:
            node = KafkaNode(host, (free_port(), free_port()), tuple(prefix))
            return start_kafka_cluster(log_dir, [node], extra, client, timeout)[0]
        except PortTaken as e:
            log.info("%s; trying other ports", e)
    node = KafkaNode(host, (free_port(), free_port()), tuple(prefix))
    return start_kafka_cluster(log_dir, [node], extra, client, timeout)[0]


def start_kafka_cluster(
    log_dir: Path,
    nodes: Sequence[KafkaNode],
    extra: dict[str, str] | None = None,
    client: dict[str, Any] | None = None,
    timeout: float = 120,
) -> list[RunningService]:
    """Apache Kafka on ``nodes`` (one cluster, every node a broker and a controller), each
    node's storage under ``log_dir``; returns once every node answers metadata requests.
    A node that fails to start stops the ones already started."""
    new_id = cluster_id()
    started: list[RunningService] = []
    try:
        for node_id in range(1, len(nodes) + 1):
            started.append(_launch(log_dir, node_id, nodes, new_id, extra or {}, timeout))
        for service, node in zip(started, nodes, strict=True):
            _wait(service, node, client or {}, timeout)
    except BaseException:
        for service in started:
            service.process.kill()
        raise
    return started


def jvm_options(home: Path) -> list[str]:
    """The JVM's options: ``KAFKA_HEAP_OPTS`` or ``HEAP_OPTIONS``, ``KAFKA_JVM_PERFORMANCE_OPTS``
    or ``PERFORMANCE_OPTIONS`` with the class-data archive when the install made one."""
    heap = os.environ.get(HEAP_ENV)
    performance = os.environ.get(PERFORMANCE_ENV)
    archive = home / CLASS_ARCHIVE
    archived = [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []
    return [
        *(heap.split() if heap is not None else HEAP_OPTIONS),
        *(performance.split() if performance is not None else [*PERFORMANCE_OPTIONS, *archived]),
        *FIXED_OPTIONS,
    ]


def node_command(home: Path, extra: Sequence[str] = ()) -> list[str]:
    """The JVM and class path every Kafka tool and node runs with (``extra``: JVM options
    after ours)."""
    return [
        java(),
        *jvm_options(home),
        *extra,
        f"-Dlog4j2.configurationFile={home / 'log4j2.yaml'}",
        "-cp",
        str(home / "libs" / "*"),
    ]


def restart_kafka_node(
    log_dir: Path,
    node_id: int,
    nodes: Sequence[KafkaNode],
    client: dict[str, Any] | None = None,
    timeout: float = 120,
) -> RunningService:
    """Node ``node_id`` of a cluster ``start_kafka_cluster`` started, started again on the
    storage it left (a broker back from a crash); returns once it answers."""
    service = _run_node(_node_folder(log_dir, node_id, nodes), nodes[node_id - 1])
    try:
        _wait(service, nodes[node_id - 1], client or {}, timeout)
    except BaseException:
        service.process.kill()
        raise
    return service


def _node_folder(log_dir: Path, node_id: int, nodes: Sequence[KafkaNode]) -> Path:
    return Path(log_dir) / f"kafka-{node_id}-{nodes[node_id - 1].ports[0]}"


def _launch(
    log_dir: Path,
    node_id: int,
    nodes: Sequence[KafkaNode],
    storage_id: str,
    extra: dict[str, str],
    timeout: float,
    jvm_extra: Sequence[str] = (),
) -> RunningService:
    """Node ``node_id`` on new, formatted storage (``jvm_extra``: the node's JVM options
    after ours)."""
    folder = _node_folder(log_dir, node_id, nodes)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "data").mkdir(parents=True)
    properties = folder / "server.properties"
    props = node_properties(node_id, nodes, folder / "data", extra)
    properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    alone = ["--standalone"] if len(nodes) == 1 else []  # one node: its own quorum
    storage = ["format", *alone, "-t", storage_id, "-c", str(properties), "--ignore-formatted"]
    fmt = subprocess.run(
        [*node_command(installed_home()), "kafka.tools.StorageTool", *storage],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if fmt.returncode != 0:
        raise ServiceError(f"formatting Kafka's storage in {folder} failed: {fmt.stderr[-500:]}")
    return _run_node(folder, nodes[node_id - 1], jvm_extra)


def _run_node(folder: Path, node: KafkaNode, jvm_extra: Sequence[str] = ()) -> RunningService:
    """The node whose properties and storage are in ``folder``, its output appended to
    ``broker.log`` there."""
    log_path = folder / "broker.log"
    properties = str(folder / "server.properties")
    command = [*node_command(installed_home(), jvm_extra), "kafka.Kafka", properties]
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [*node.prefix, *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return RunningService("broker", node.address, proc, log_path, stop_timeout=60)


def _wait(service: RunningService, node: KafkaNode, client: dict[str, Any], timeout: float) -> None:
    def answers() -> None:
        from kafka import KafkaAdminClient

        if not node.prefix:  # the port first: a Kafka client logs each refused connection
            socket.create_connection((node.host, node.ports[0]), timeout=1).close()
        admin = KafkaAdminClient(bootstrap_servers=node.address, request_timeout_ms=2000, **client)
        admin.close()

    where = f"Apache Kafka on {node.address}"
    wait_until_answers(answers, where, service.process, timeout, service.log_path)
    log.info("Apache Kafka %s on %s", KAFKA_VERSION, node.address)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["install"]:
        print("usage: python -m devservices.kafka_broker install", file=sys.stderr)
        return 2
    try:
        print(install_kafka())
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
