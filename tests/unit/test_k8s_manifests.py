"""deploy/k8s, checked offline: every object against the Kubernetes API's own schemas
(``kubernetes-validate``, which ships them; strict, so a misspelt field fails), and the
config, the StatefulSets' pods, their names, ports and the shared volume agree."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from devservices.kafka_broker import KAFKA_VERSION
from streamrec.config import PipelineConfig, load_config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
VERSION = "1.34"


def _objects() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _objects() if o["kind"] == kind}


def _pipeline(repo: Path, tmp_path: Path) -> PipelineConfig:
    """The ConfigMap's pipeline.yaml, loaded by the real loader (the image's /app is this
    checkout; the Secret's file is a stand-in)."""
    text = _by_kind("ConfigMap")["streamrec-config"]["data"]["pipeline.yaml"]
    secret = tmp_path / "redis-password"
    secret.write_text("stand-in")
    text = text.replace("/app/configs", str(repo / "configs"))
    text = text.replace("/run/secrets/streamrec/redis-password", str(secret))
    (tmp_path / "pipeline.yaml").write_text(text)
    return load_config(tmp_path / "pipeline.yaml")


@pytest.mark.parametrize("obj", _objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_is_valid_kubernetes(obj: dict[str, Any]) -> None:
    """``validate`` raises ValidationError on a bad object (test_a_misspelt_field_is_caught
    shows it does) and returns the API version it checked against."""
    assert kubernetes_validate.validate(obj, VERSION, strict=True) == VERSION


def test_a_misspelt_field_is_caught() -> None:
    """The validator is strict: the check above can fail."""
    deployment = _by_kind("Deployment")["streamrec-serving"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def _ours(kind: str) -> dict[str, dict[str, Any]]:
    """The workloads of ``kind`` that run streamrec's image (not the Kafka or the
    Prometheus beside it)."""
    return {
        name: o
        for name, o in _by_kind(kind).items()
        if any(
            c["image"].startswith("streamrec:") for c in o["spec"]["template"]["spec"]["containers"]
        )
    }


def test_every_node_is_a_statefulset_pod_at_its_stable_name(repo: Path, tmp_path: Path) -> None:
    cfg = _pipeline(repo, tmp_path)
    sets, services = _ours("StatefulSet"), _by_kind("Service")
    pods: dict[str, tuple[str, set[int]]] = {}
    for name, stateful in sets.items():
        spec = stateful["spec"]
        assert spec["podManagementPolicy"] == "Parallel", name  # a generation needs them all
        headless = services[spec["serviceName"]]["spec"]
        assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"]
        container = spec["template"]["spec"]["containers"][0]
        assert "streamrec cluster" in container["command"][-1]
        assert "--check" in container["readinessProbe"]["exec"]["command"][-1]
        assert "--check" in container["startupProbe"]["exec"]["command"][-1]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        ports = {p["containerPort"] for p in container["ports"]}
        for i in range(spec["replicas"]):
            pods[f"{name}-{i}"] = (f"{name}-{i}.{spec['serviceName']}", ports)
    assert {n.name for n in cfg.cluster.nodes} == set(pods)
    for node in cfg.cluster.nodes:
        address, ports = pods[node.name]
        assert node.address == address
        assert set(node.server_ports + node.worker_ports) <= ports
    first = next(n for n in cfg.cluster.nodes if n.server_ports)
    assert cfg.cluster.rendezvous_port in pods[first.name][1]
    assert (cfg.cluster.servers, cfg.cluster.workers) == (2, 2)


def test_every_pod_shares_the_data_volume_and_reads_secrets_from_the_secret(
    repo: Path, tmp_path: Path
) -> None:
    cfg = _pipeline(repo, tmp_path)
    claim = _by_kind("PersistentVolumeClaim")["streamrec-data"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for path in (cfg.paths.data_root, cfg.paths.checkpoint_root, cfg.paths.work_root):
        assert str(path).startswith("/data/")
    workloads = {**_ours("StatefulSet"), **_ours("Deployment")}
    assert workloads["streamrec-pass-builder"]["spec"]["replicas"] >= 2
    assert workloads["streamrec-serving"]["spec"]["replicas"] >= 2
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "streamrec-data", name
        assert volumes["secrets"]["secret"]["secretName"] == "streamrec-secrets", name
        for container in pod["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/data"] == "data" and mounts["/run/secrets/streamrec"] == "secrets"
            assert all(
                "value" not in e or "PASSWORD" not in e["name"] for e in container.get("env", [])
            )
    assert cfg.redis.password_file is not None and cfg.redis.password_env is None
    assert not _by_kind("Secret"), "a Secret's values do not belong in the repository"
    serving = workloads["streamrec-serving"]["spec"]["template"]["spec"]["containers"][0]
    assert serving["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert serving["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_kafka_is_three_kraft_nodes_on_the_tested_version(repo: Path, tmp_path: Path) -> None:
    """The Kafka beside the pipeline runs the version the tests run, as three nodes that
    each vote, every topic at 3 replicas writing while 2 are in sync, and the pipeline's
    bootstrap address is its Service."""
    cfg = _pipeline(repo, tmp_path)
    kafka = _by_kind("StatefulSet")["kafka"]["spec"]
    container = kafka["template"]["spec"]["containers"][0]
    assert container["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = {e["name"]: e["value"] for e in container["env"]}
    headless = _by_kind("Service")[kafka["serviceName"]]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"]
    voters = [f"{i + 1}@kafka-{i}.{kafka['serviceName']}:9093" for i in range(kafka["replicas"])]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",") == voters
    assert kafka["replicas"] == 3 and kafka["podManagementPolicy"] == "Parallel"
    for key in ("DEFAULT_REPLICATION_FACTOR", "OFFSETS_TOPIC_REPLICATION_FACTOR",
                "TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):  # fmt: skip
        assert env[f"KAFKA_{key}"] == "3", key
    assert env["KAFKA_MIN_INSYNC_REPLICAS"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16  # a KRaft cluster id
    assert _by_kind("PodDisruptionBudget")["kafka"]["spec"]["maxUnavailable"] == 1
    host, port = cfg.kafka.bootstrap_servers.split(":")
    ports = {p["port"] for p in _by_kind("Service")[host]["spec"]["ports"]}
    assert int(port) in ports


def test_prometheus_scrapes_every_metrics_port_with_the_shipped_rules(
    repo: Path, tmp_path: Path
) -> None:
    """The Prometheus config is valid (``promtool check config``, with the shipped rules
    where the ConfigMap mounts them), finds streamrec's pods, and every streamrec container
    serving metrics names its port ``metrics`` at the port its command gives. Debian's
    promtool is built without Kubernetes discovery (it refuses ``kubernetes_sd_configs``),
    so the check sees a static target in its place; the image's Prometheus has it."""
    raw = yaml.safe_load(_by_kind("ConfigMap")["streamrec-prometheus"]["data"]["prometheus.yml"])
    (job,) = raw["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [
        {"role": "pod", "namespaces": {"own_namespace": True}}
    ]
    job["static_configs"] = [{"targets": ["pod:9464"]}]
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(repo / "deploy/prometheus/streamrec-alerts.yml", rules)
    (file,) = raw["rule_files"]
    raw["rule_files"] = [file.replace("/etc/prometheus/rules/", f"{rules}/")]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(raw))
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True)
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()
    prometheus = _by_kind("Deployment")["streamrec-prometheus"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in prometheus["containers"][0]["volumeMounts"]}
    assert mounts["rules"] == "/etc/prometheus/rules"
    assert f"--config.file={mounts['config']}/prometheus.yml" in prometheus["containers"][0]["args"]
    serving_metrics = {"streamrec-exporter": "--port", "streamrec-pass-builder": "--metrics-port"}
    for name, flag in serving_metrics.items():
        container = _ours("Deployment")[name]["spec"]["template"]["spec"]["containers"][0]
        command = container["command"]
        port = int(command[command.index(flag) + 1])
        assert {"name": "metrics", "containerPort": port} in container["ports"], name
