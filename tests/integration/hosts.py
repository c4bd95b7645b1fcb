"""Several hosts on one machine, made from network namespaces, for the multi-host tests.

Each host is a network namespace with its own address on one bridge (a veth pair each),
its own host name (a UTS namespace, ``unshare --uts``) and a hosts file that resolves that
name to its address (``/etc/netns/<ns>/hosts``, which ``ip netns exec`` mounts over
``/etc/hosts``), as a real host's name resolves to its own address. The machine's own side
of the bridge has an address too, so the test process reaches the hosts' services; nothing
is routed anywhere else. ``Network`` removes everything it made on exit, also when the test
fails, and SIGKILLs whatever still runs inside a namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from devservices.kafka_broker import start_kafka

NETNS_ETC = Path("/etc/netns")
SUBNET_LOCK = Path(tempfile.gettempdir()) / "streamrec-test-networks.lock"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def can_make_hosts() -> str | None:
    """Why namespaces cannot be made here, or None (root and iproute2 are needed)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "iproute2 and util-linux (ip, unshare) are needed"
    return None


@dataclass(frozen=True)
class Host:
    """One namespace host: its name (also its host name), namespace and address."""

    name: str
    namespace: str
    address: str
    link: str  # the machine's end of its veth pair

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host: in its namespace, under its own host name."""
        script = f'hostname {self.name} && exec "$@"'  # "$@": the words after sh's $0
        wrap = ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c", script]
        return [*wrap, "sh", *argv]

    def popen(
        self, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start ``argv`` on this host, output to ``log``; the process is ``argv`` itself
        (each wrapper execs the next), so a signal to its pid reaches it."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            return subprocess.Popen(
                self.command(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def run(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(argv),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )

    def pids(self) -> list[int]:
        """Every process running in this host's namespace."""
        out = _ip("netns", "pids", self.namespace, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> int:
        """SIGKILL every process of this host at once, as a host that loses power; how many."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def cut(self) -> None:
        """Unplug this host: its link goes down, every packet to or from it is lost."""
        _ip("link", "set", self.link, "down")

    def plug(self) -> None:
        _ip("link", "set", self.link, "up")


class Network:
    """``names`` hosts on one bridge, ``with Network([...]) as net: net.hosts[name]``."""

    def __init__(self, names: list[str]) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.bridge = f"srb{self.tag}"
        self.names = names
        self.hosts: dict[str, Host] = {}

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        """A /24 in 10.240.0.0/12 that no route of this machine covers."""
        routes = _ip("-4", "route", "show").stdout
        taken = []
        for line in routes.splitlines():
            word = line.split()[0]
            if word != "default":
                taken.append(ipaddress.IPv4Network(word, strict=False))
        for third in range(240, 256):
            for second in range(256):
                candidate = ipaddress.IPv4Network(f"10.{third}.{second}.0/24")
                if not any(candidate.overlaps(t) for t in taken):
                    return candidate
        raise RuntimeError("no free /24 for the test hosts")

    def __enter__(self) -> Network:
        try:
            # one network at a time picks its subnet and takes it (its bridge's address is
            # the route the next one sees): concurrent test workers would pick the same
            with open(SUBNET_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._make()
        except BaseException:
            self.remove()
            raise
        return self

    def _make(self) -> None:
        self.subnet = self._free_subnet()
        base = self.subnet.network_address
        self.gateway = str(base + 1)
        self.hosts = {
            name: Host(name, f"sr{self.tag}-{name}", str(base + 10 + i), f"srv{self.tag}{i}")
            for i, name in enumerate(self.names)
        }
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        names = "\n".join(f"{h.address} {h.name}" for h in self.hosts.values())
        for host in self.hosts.values():
            _ip("netns", "add", host.namespace)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns",
                host.namespace)  # fmt: skip
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            etc = NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}\n")
        self._wait_reachable()

    def _wait_reachable(self, timeout_s: float = 10) -> None:
        """Until every host's link is up (a bridge port takes a moment to forward)."""
        deadline = time.monotonic() + timeout_s
        for host in self.hosts.values():
            while "state UP" not in _ip("-n", host.namespace, "link", "show", "eth0").stdout:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{host.name}'s link never came up")
                time.sleep(0.1)

    def remove(self) -> None:
        """Kill what runs on the hosts, then remove namespaces, links, bridge, hosts files."""
        for host in self.hosts.values():
            host.kill_all()
        for host in self.hosts.values():
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)

    def __exit__(self, *exc: object) -> None:
        self.remove()


def start_services(host: Host, logs: Path) -> tuple[str, str, list[subprocess.Popen]]:
    """Apache Kafka on port 9092 and a redis-server on 6379 of ``host``'s address, never
    loopback; (bootstrap servers, Redis URL, their processes) once both answer. The
    network's removal ends them."""
    import redis

    broker = start_kafka(logs, host.address, (9092, 9093), prefix=host.command([]))
    server = ["redis-server", "--port", "6379", "--bind", host.address, "--dir", str(logs)]
    server += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]  # no password here
    procs = [broker.process, host.popen(server, logs / "redis.log")]
    url = f"redis://{host.address}:6379/0"
    deadline = time.monotonic() + 30
    while True:
        try:
            redis.Redis.from_url(url, socket_timeout=1).ping()
            return broker.address, url, procs
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
