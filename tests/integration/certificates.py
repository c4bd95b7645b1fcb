"""A test CA, a broker certificate it signs for 127.0.0.1, and an unrelated CA (openssl)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    ca: Path  # signed the broker's certificate
    other_ca: Path  # a CA the broker's certificate has nothing to do with
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path) -> Certificates:
    """A CA, a broker certificate it signs for 127.0.0.1, and an unrelated CA."""
    for name in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN=streamrec {name}",
            cwd=directory,
        )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", "/CN=127.0.0.1", cwd=directory,
    )  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.cnf", "-out", "broker.pem",
        cwd=directory,
    )  # fmt: skip
    return Certificates(
        directory / "ca.pem", directory / "other-ca.pem", directory / "broker.pem",
        directory / "broker.key",
    )  # fmt: skip


def broker_ssl(directory: Path, certs: Certificates) -> dict[str, str]:
    """A broker's SSL properties: its key and certificate as a PEM keystore, and the CA as
    its truststore (at start the broker checks that a client with its own settings gets
    through, which needs the CA)."""
    keystore = directory / "broker-keystore.pem"  # the key, then the certificate
    keystore.write_text(certs.key.read_text() + certs.cert.read_text())
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca),
    }
