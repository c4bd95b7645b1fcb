"""docker-compose.yml describes the deployment; Debian's docker-compose validates it
without an engine. Secrets come only from the environment: .env.example lists them, and
compose refuses to render the file without each one."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from devservices.kafka_broker import KAFKA_VERSION
from streamrec.config import ClusterConfig, dump_config, load_config
from streamrec.contracts.cluster import NodeBeat
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys
from trainers.hosts.generation import GenerationStore

REQUIRED_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?")
CONFIG_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SECRET_KEY = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY|_AUTH)$")  # env names
AIRFLOW_COMMANDS = {
    "airflow-init": ["airflow", "db", "migrate"],
    "airflow-api-server": ["airflow", "api-server"],
    "airflow-scheduler": ["airflow", "scheduler"],
    "airflow-dag-processor": ["airflow", "dag-processor"],
    "airflow-triggerer": ["airflow", "triggerer"],
}
ONE_SHOT = {"airflow-init"}


def _example_vars(repo: Path) -> dict[str, str]:
    """The uncommented ``NAME=value`` lines of .env.example."""
    lines = (repo / ".env.example").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def _test_secrets(repo: Path) -> dict[str, str]:
    """A distinct value per variable, so the rendered file shows where each one went."""
    return {name: f"test-{name.lower().replace('_', '-')}" for name in _example_vars(repo)}


def _compose_config(
    repo: Path, tmp_path: Path, secrets: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed; scripts/setup.sh installs it")
    env = {k: v for k, v in os.environ.items() if k not in _example_vars(repo)} | secrets
    empty = tmp_path / "empty.env"  # a developer's .env must not supply what the test withholds
    empty.write_text("")
    compose = str(repo / "docker-compose.yml")
    return subprocess.run(
        [exe, "--env-file", str(empty), "-f", compose, "config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo,
    )


def _rendered_services(repo: Path, tmp_path: Path, secrets: dict[str, str]) -> dict[str, Any]:
    out = _compose_config(repo, tmp_path, secrets)
    assert out.returncode == 0, out.stderr
    assert "standalone" not in out.stdout
    return yaml.safe_load(out.stdout)["services"]


def _strings(node: Any) -> list[str]:
    """Every string value in a YAML document (comments left out)."""
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [node] if isinstance(node, str) else []


def _environments(node: Any) -> list[dict[str, Any]]:
    """Every ``environment`` mapping in a raw (uninterpolated) compose document."""
    if isinstance(node, list):
        return [env for item in node for env in _environments(item)]
    if not isinstance(node, dict):
        return []
    found = [node["environment"]] if isinstance(node.get("environment"), dict) else []
    return found + [env for value in node.values() for env in _environments(value)]


def test_compose_file_is_valid_and_complete(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = _test_secrets(repo)
    services = _rendered_services(repo, tmp_path, secrets)
    assert {
        "kafka",
        "redis",
        "postgres",
        *AIRFLOW_COMMANDS,
        "pass-builder",
        "pserver-0",
        "trainer-0",
        "trainer-1",
        "serving",
    } <= set(services)

    one_shot = {name for name, s in services.items() if s.get("restart", "no") == "no"}
    assert one_shot == ONE_SHOT
    unchecked = {n for n, s in services.items() if n not in ONE_SHOT and not s.get("healthcheck")}
    assert not unchecked, f"long-running services without a healthcheck: {unchecked}"

    for name, command in AIRFLOW_COMMANDS.items():
        s = services[name]
        assert s["command"] == command
        env = s["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        conn = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert conn.startswith("postgresql") and secrets["POSTGRES_PASSWORD"] in conn
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == secrets["AIRFLOW_JWT_SECRET"]
        assert env["AIRFLOW__API__SECRET_KEY"] == secrets["AIRFLOW_API_SECRET_KEY"]
        assert env["AIRFLOW__CORE__FERNET_KEY"] == secrets["AIRFLOW_FERNET_KEY"]
        assert env["REDIS_PASSWORD"] == secrets["REDIS_PASSWORD"]  # the DAG loads the config
        assert s["depends_on"]["postgres"] == {"condition": "service_healthy"}
        if name != "airflow-init":
            assert s["depends_on"]["airflow-init"] == {
                "condition": "service_completed_successfully"
            }
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == secrets["POSTGRES_PASSWORD"]
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]

    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--requirepass") + 1] == secrets["REDIS_PASSWORD"]
    assert services["pass-builder"]["command"][:2] == ["streamrec", "build-passes"]
    assert services["serving"]["command"][:2] == ["streamrec", "serve"]
    assert services["exporter"]["command"][:2] == ["streamrec", "exporter"]
    # Prometheus reads the shipped config and rules (the test command checks them)
    mounts = [v.split(":")[0] for v in services["prometheus"]["volumes"]]
    assert str(repo / "deploy" / "prometheus") in mounts, mounts
    assert services["pass-builder"]["depends_on"]["kafka"] == {"condition": "service_healthy"}
    for name in ("trainer-0", "trainer-1", "serving"):
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
        assert services[name]["environment"]["REDIS_PASSWORD"] == secrets["REDIS_PASSWORD"]

    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    # the broker deployed is the version every test runs on (devservices.kafka_broker)
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    # every node of the config's cluster runs as the service of its name, as that host
    monkeypatch.setenv("REDIS_PASSWORD", secrets["REDIS_PASSWORD"])  # the config checks it
    cfg = load_config(repo / "configs" / "pipeline.docker.yaml")
    assert (cfg.cluster.servers, cfg.cluster.workers) == (1, 2)
    for node in cfg.cluster.nodes:
        s = services[node.name]
        assert s["command"][:2] == ["streamrec", "cluster"]
        assert s["command"][s["command"].index("--node") + 1] == node.name
        assert s["hostname"] == node.name == node.address  # gloo: the name is the address
        assert s["restart"] == "unless-stopped"  # a restarted one rejoins a new generation


def test_streamrec_commands_exist(repo: Path, tmp_path: Path) -> None:
    """The image's commands are ones the package installs: ``--help`` of each one runs."""
    services = _rendered_services(repo, tmp_path, _test_secrets(repo))
    scripts = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["scripts"]
    for name in ("pass-builder", "pserver-0", "trainer-0", "serving", "exporter"):
        command = services[name]["command"]
        assert command[0] in scripts, f"{name}: {command[0]} is not in pyproject's scripts"
        module = scripts[command[0]].split(":")[0]
        argv = [sys.executable, "-m", module, *command[1:2]]  # the subcommand
        out = subprocess.run([*argv, "--help"], capture_output=True, text=True, cwd=repo)
        assert out.returncode == 0, f"{name}: {command} -> {out.stderr}"


def test_compose_refuses_to_render_without_each_secret(repo: Path, tmp_path: Path) -> None:
    secrets = _test_secrets(repo)
    assert secrets, ".env.example lists no variables"
    for missing in secrets:
        out = _compose_config(repo, tmp_path, {k: v for k, v in secrets.items() if k != missing})
        assert out.returncode != 0, f"docker-compose config succeeded without {missing}"
        assert missing in out.stderr, out.stderr


def test_no_secret_is_written_in_the_yaml(repo: Path) -> None:
    compose_text = (repo / "docker-compose.yml").read_text()
    config_text = (repo / "configs" / "pipeline.docker.yaml").read_text()
    example = _example_vars(repo)
    # .env.example lists exactly what the two files read from the environment
    compose, config = yaml.safe_load(compose_text), yaml.safe_load(config_text)
    compose_vars = {v for s in _strings(compose) for v in REQUIRED_VAR.findall(s)}
    config_vars = {v for s in _strings(config) for v in CONFIG_VAR.findall(s)}
    config_vars.add(config["redis"]["password_env"])  # a secret: named, read at connect
    assert set(example) == compose_vars | config_vars
    for text in (compose_text, config_text):
        for placeholder in set(example.values()):
            assert placeholder not in text
        assert "standalone" not in text

    for passwd in re.findall(r"requirepass[\s\"',]+([^\s\"',]+)", compose_text):
        assert passwd.startswith("${REDIS_PASSWORD"), f"a literal Redis password: {passwd}"
    for env in _environments(compose):
        for key, value in env.items():
            if SECRET_KEY.search(key):
                assert str(value).startswith("${"), f"{key} holds a literal secret"
            userinfo = re.search(r"://[^/@:]*:([^/@]+)@", str(value))  # a password in a URL
            if userinfo:
                assert userinfo.group(1).startswith("${"), f"{key} holds a literal password"

    url = config["redis"]["url"]
    assert "@" not in url and config["redis"]["password_env"] == "REDIS_PASSWORD", url


def test_node_healthcheck_reads_the_node_agents_heartbeat(repo: Path, make_config) -> None:
    """The cluster nodes' healthcheck, run as compose runs it (a shell, the host name for
    the node), against a real Redis: unhealthy until the node's agent heartbeats with its
    members running, healthy then."""
    raw = yaml.safe_load((repo / "docker-compose.yml").read_text())
    kind, command = raw["x-cluster-node"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and "--check" in command
    node = {"name": socket.gethostname().lower(), "address": "10.0.0.1", "server_ports": [1]}
    cluster = ClusterConfig.model_validate({"nodes": [{**node, "worker_ports": [2]}]})
    cfg = make_config(cluster=cluster)
    config = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    shell = command.replace("$$", "$").replace("/app/configs/pipeline.docker.yaml", str(config))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    store = GenerationStore(connect(cfg.redis), RedisKeys(cfg.name), [node["name"]])

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", shell], env=env, capture_output=True, text=True)

    before = check()
    assert before.returncode == 1 and "no heartbeat" in before.stdout, before.stderr
    beat = NodeBeat(
        node=node["name"],
        address="10.0.0.1",
        incarnation="i-1",
        generation=1,
        state="waiting for ['b']",
    )
    store.beat(beat, ttl_s=30)
    assert check().returncode == 1  # alive, but its members do not run
    store.beat(beat.model_copy(update={"state": "running"}), ttl_s=30)
    after = check()
    assert after.returncode == 0 and "running" in after.stdout, after.stderr
