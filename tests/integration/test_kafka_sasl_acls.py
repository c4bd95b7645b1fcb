"""Secured Kafka, for real: Apache Kafka with a SASL_SSL listener (a CA this test makes),
SASL/PLAIN users from the broker's JAAS settings, SASL/SCRAM-SHA-512 users created through
Kafka's admin API, and ACLs (StandardAuthorizer, nothing allowed without one). Through the
commands a user runs: ``streamrec produce`` as a PLAIN user that may only write, ``streamrec
build-passes`` as a SCRAM user that may read the topics and use the group; a wrong
password, and a principal without READ on the topic or on the group, are exit 3 naming the
key to fix, and nothing is consumed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from certificates import broker_ssl, make_certificates
from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourceType,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from devservices.kafka_broker import start_kafka
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import complete_passes
from streamrec.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # ~150 s alone, under load more

STREAMREC = str(Path(sys.executable).parent / "streamrec")
FIRST = "202609010000"
ADMIN, WRITER, READER, NO_GROUP, NO_TOPIC = "admin", "writer", "reader", "nogroup", "notopic"
PASSWORDS = {name: f"{name}-secret" for name in (ADMIN, WRITER, READER, NO_GROUP, NO_TOPIC)}
PLAIN_USERS = (ADMIN, WRITER)  # from the broker's JAAS settings
SCRAM_USERS = (READER, NO_GROUP, NO_TOPIC)  # created through the admin API


@dataclass(frozen=True)
class SecuredKafka:
    address: str
    cafile: Path
    secrets: Path  # a folder with each user's password in a file of its name


def _plain_jaas() -> str:
    users = " ".join(f'user_{u}="{PASSWORDS[u]}"' for u in PLAIN_USERS)
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{ADMIN}" password="{PASSWORDS[ADMIN]}" {users};'
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    root = tmp_path_factory.mktemp("secured-kafka")
    certs = make_certificates(root)
    port, internal, controller = free_port(), free_port(), free_port()
    properties = {
        "listeners": f"SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},"
        f"CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,"
        "CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": _plain_jaas(),
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        # the broker's own loopback listeners (inter-broker, controller) are anonymous
        "super.users": f"User:{ADMIN};User:ANONYMOUS",
        **broker_ssl(root, certs),
    }
    admin_client = {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(certs.ca),
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": ADMIN,
        "sasl_plain_password": PASSWORDS[ADMIN],
    }
    broker = start_kafka(
        root, ports=(port, controller), extra=properties, client=admin_client, timeout=180
    )
    try:
        admin = KafkaAdminClient(bootstrap_servers=broker.address, **admin_client)
        admin.alter_user_scram_credentials(
            [
                UserScramCredentialUpsertion(user, ScramMechanism.SCRAM_SHA_512, PASSWORDS[user])
                for user in SCRAM_USERS
            ]
        )
        admin.create_acls(_acls())
        admin.close()
        secrets = root / "secrets"
        secrets.mkdir()
        for user, password in PASSWORDS.items():
            (secrets / user).write_text(password)
        yield SecuredKafka(broker.address, certs.ca, secrets)
    finally:
        broker.stop()


def _allow(user: str, kind: ResourceType, name: str, operation: ACLOperation) -> ACL:
    return ACL(
        principal=f"User:{user}",
        host="*",
        operation=operation,
        permission_type=ACLPermissionType.ALLOW,
        resource_pattern=ResourcePattern(kind, name, ACLResourcePatternType.PREFIXED),
    )


def _acls() -> list[ACL]:
    """What each user may do: the writer writes (and creates) the topics, the readers read
    them (and their dead-letter topics, written by the builder); ``nogroup`` may not use
    the group, ``notopic`` may not read the topics. Names by prefix: each test's topics and
    group carry its pipeline's name."""
    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    acls = [
        _allow(WRITER, topic, "impressions-", op)
        for op in (ACLOperation.WRITE, ACLOperation.CREATE, ACLOperation.DESCRIBE)
    ]
    acls += [
        _allow(WRITER, topic, "clicks-", op)
        for op in (ACLOperation.WRITE, ACLOperation.CREATE, ACLOperation.DESCRIBE)
    ]
    for user in (READER, NO_GROUP, NO_TOPIC):
        for prefix in ("impressions-", "clicks-"):
            acls.append(_allow(user, topic, prefix, ACLOperation.DESCRIBE))
            acls.append(_allow(user, topic, prefix, ACLOperation.WRITE))  # dead letters
            acls.append(_allow(user, topic, prefix, ACLOperation.CREATE))
            if user != NO_TOPIC:
                acls.append(_allow(user, topic, prefix, ACLOperation.READ))
        if user != NO_GROUP:
            acls.append(_allow(user, group, "builders-", ACLOperation.READ))
    return acls


def _as(
    cfg: PipelineConfig, secured: SecuredKafka, user: str, mechanism: str, password: str = ""
) -> PipelineConfig:
    return derived(
        cfg,
        f"the config as {user}",
        kafka={
            "bootstrap_servers": secured.address,
            "security_protocol": "SASL_SSL",
            "ssl_cafile": secured.cafile,
            "sasl_mechanism": mechanism,
            "sasl_username": user,
            "sasl_password_file": secured.secrets / (password or user),
            "consumer_group": f"builders-{cfg.name}",
        },
    )


def _run(cfg: PipelineConfig, name: str, *args: str) -> subprocess.CompletedProcess:
    config = dump_config(cfg, Path(cfg.paths.work_root) / f"{name}.yaml")
    return subprocess.run(
        [STREAMREC, args[0], "--config", str(config), *args[1:]],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_users_produce_and_build_through_sasl_and_acls_and_the_rest_are_refused(
    make_config, secured: SecuredKafka
) -> None:
    plain = make_config(join={"mode": "label_in_impression"}, synthetic={"events_per_pass": 300})
    writer = _as(plain, secured, WRITER, "PLAIN")
    produce = ("produce", "--synthetic", "--passes", "2", "--start", FIRST)
    done = _run(writer, "writer", *produce)
    assert done.returncode == 0, done.stderr[-3000:]

    build = ("build-passes", "--idle-timeout", "20")
    wrong = _run(_as(plain, secured, READER, "SCRAM-SHA-512", password=WRITER), "wrong", *build)
    assert wrong.returncode == 3, wrong.stderr[-3000:]
    assert "kafka.sasl_password" in wrong.stderr and "Traceback" not in wrong.stderr
    for user, key in ((NO_GROUP, "kafka.consumer_group"), (NO_TOPIC, "kafka.impressions_topic")):
        refused = _run(_as(plain, secured, user, "SCRAM-SHA-512"), user, *build)
        assert refused.returncode == 3, refused.stderr[-3000:]
        assert f"User:{user}" in refused.stderr and key in refused.stderr, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr
    assert complete_passes(plain.paths.data_root) == []  # nothing consumed

    reader = _run(_as(plain, secured, READER, "SCRAM-SHA-512"), "reader", *build)
    assert reader.returncode == 0, reader.stderr[-3000:]
    assert FIRST in complete_passes(plain.paths.data_root)
