"""Kafka over TLS, through the commands a user runs: Apache Kafka with an SSL listener (its
key and certificate a PEM keystore, signed by a CA this test makes). The producer CLI and
the pass builder reach it with ``kafka.security_protocol: SSL`` and ``kafka.ssl_cafile``; a
client that does not trust the broker's certificate, or speaks plaintext to it, gets
nothing through."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from certificates import Certificates, broker_ssl, make_certificates

from devservices.kafka_broker import start_kafka
from streaming.pass_builder import PassBuilder
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import pass_dir, read_manifest
from streamrec.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # ~150 s alone, under load more

STREAMREC = str(Path(sys.executable).parent / "streamrec")
FIRST = "202609010000"


@contextmanager
def tls_broker(directory: Path, certs: Certificates) -> Iterator[str]:
    """Apache Kafka whose client listener is SSL only; its address."""
    port, controller = free_port(), free_port()
    tls = {
        "listeners": f"SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SSL",
        **broker_ssl(directory, certs),
    }
    client = {"security_protocol": "SSL", "ssl_cafile": str(certs.ca)}
    broker = start_kafka(directory, ports=(port, controller), extra=tls, client=client)
    try:
        yield broker.address
    finally:
        broker.stop()


def _on_tls(cfg: PipelineConfig, address: str, cafile: Path | None) -> PipelineConfig:
    protocol = "SSL" if cafile is not None else "PLAINTEXT"
    return derived(
        cfg,
        f"the config on {protocol}",
        kafka={"bootstrap_servers": address, "security_protocol": protocol, "ssl_cafile": cafile},
    )


def _produce(cfg: PipelineConfig, name: str, timeout: float = 120) -> subprocess.CompletedProcess:
    config = dump_config(cfg, Path(cfg.paths.work_root) / f"{name}.yaml")
    args = ["produce", "--config", str(config), "--synthetic", "--passes", "2", "--start", FIRST]
    return subprocess.run([STREAMREC, *args], capture_output=True, text=True, timeout=timeout)


def test_the_pipeline_reaches_kafka_over_tls(make_config, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    plain = make_config(join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 400})
    with tls_broker(tmp_path, certs) as address:
        cfg = _on_tls(plain, address, certs.ca)
        done = _produce(cfg, "tls")
        assert done.returncode == 0, done.stderr[-3000:]

        untrusted = _produce(_on_tls(plain, address, certs.other_ca), "untrusted", 240)
        assert untrusted.returncode == 3, untrusted.stdout + untrusted.stderr
        assert "cannot reach Kafka" in untrusted.stderr and "kafka.ssl_cafile" in untrusted.stderr
        assert "[SSL: CERTIFICATE_VERIFY_FAILED]" in untrusted.stderr  # the handshake's own line
        plaintext = _produce(_on_tls(plain, address, None), "plaintext", 240)
        assert plaintext.returncode == 3, plaintext.stdout + plaintext.stderr

        builder = PassBuilder(cfg)
        try:  # the second window's events close the first
            builder.run(until_pass=FIRST, idle_timeout_s=60)
        finally:
            builder.close()
    manifest = read_manifest(pass_dir(cfg.paths.data_root, FIRST))
    assert manifest.rows == 400 and manifest.counts.malformed_total == 0
