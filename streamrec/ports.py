"""Loopback ports for local processes (a single host's cluster, Airflow run locally, the
demo's and the tests' services): a free port from a range no outgoing connection takes.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

from streamrec.errors import ServiceError

PORT_RANGE_ENV = "STREAMREC_PORT_RANGE"
_handed_out: set[int] = set()


def port_range() -> range:
    """Ports to take local services' ports from: ``STREAMREC_PORT_RANGE`` (``low-high``), or
    the 12,000 ports below the kernel's ephemeral range, which no outgoing connection takes
    between our check and the service's bind."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if spec:
        low, _, high = spec.partition("-")
        return range(int(low), int(high) + 1)
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    return range(max(1024, ephemeral - 12000), ephemeral)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, from ``port_range()``, never the
    same twice in one process; concurrent test workers get disjoint ranges (tests/README.md)."""
    ports = port_range()
    start = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ServiceError(f"no free port left in {ports.start}-{ports.stop - 1} ({PORT_RANGE_ENV})")
