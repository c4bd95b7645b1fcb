"""The operator CLI as a user runs it (a subprocess): every subcommand has --help, and the
exit codes scripts rely on: 2 for a bad config (naming the key), 3 for a service that is
not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops.cli import DELEGATED, plugin_commands
from streamrec.ports import free_port

CLI = str(Path(sys.executable).with_name("streamrec"))
OWN = ["status", "report", "deliver", "rollback", "online", "retention", "schema"]
PLUGINS = list(plugin_commands())  # the demo, from the entry point group


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [*DELEGATED, *PLUGINS, *OWN])
def test_every_subcommand_has_help(command: str) -> None:
    out = _run(command, "--help")
    assert out.returncode == 0, out.stderr
    assert f"streamrec {command}" in out.stdout and "--config" in out.stdout


def test_top_level_help_lists_every_subcommand_and_the_exit_codes() -> None:
    out = _run("--help")
    assert out.returncode == 0
    assert PLUGINS == ["demo"]
    assert all(c in out.stdout for c in [*DELEGATED, *PLUGINS, *OWN])
    assert "Exit codes" in out.stdout


def _config(repo: Path, tmp_path: Path, **changes: object) -> Path:
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    raw["schema"] = str(repo / "configs" / "schema.yaml")
    raw["model"] = str(repo / "configs" / "models" / "ctr_dnn.yaml")
    raw["paths"] = {k: str(tmp_path / k) for k in raw["paths"]}
    raw.update(changes)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_schema_prints_the_contract_the_builder_checks(repo: Path, tmp_path: Path) -> None:
    from jsonschema import Draft202012Validator

    from streaming.event_contract import pipeline_schemas
    from streamrec.config import load_config

    config = _config(repo, tmp_path, kafka={"bootstrap_servers": "embedded", "partitions": 2})
    for event in ("impression", "click"):
        out = _run("schema", "--config", str(config), "--event", event)
        assert out.returncode == 0, out.stderr
        printed = json.loads(out.stdout)
        Draft202012Validator.check_schema(printed)
        assert printed == pipeline_schemas(load_config(config))[event]
    config = _config(repo, tmp_path, join={"mode": "label_in_impression"})
    out = _run("schema", "--config", str(config), "--event", "click")
    assert out.returncode == 2 and "reads no click events (it reads: impression" in out.stderr


def test_bad_config_exits_2_naming_the_key(repo: Path, tmp_path: Path) -> None:
    config = _config(repo, tmp_path, retention={"passes_days": -1})
    out = _run("status", "--config", str(config))
    assert out.returncode == 2
    assert "retention.passes_days" in out.stderr


def test_unreachable_redis_exits_3(repo: Path, tmp_path: Path) -> None:
    config = _config(repo, tmp_path, redis={"url": f"redis://127.0.0.1:{free_port()}/0"})
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"event_id": "e1", "event_time": 0, "sparse": {}}) + "\n")
    commands = (
        ["status"],
        ["retention", "--dry-run"],
        ["rollback"],
        ["predict", "--events", str(events)],
    )
    for command in commands:
        out = _run(*command, "--config", str(config))
        assert out.returncode == 3, (command, out.stderr)
        assert "Redis" in out.stderr


def test_sigusr1_prints_every_stack_and_the_command_goes_on(repo: Path) -> None:
    """``kill -USR1`` on a command shows where each thread waits; SIGTERM still stops it."""
    import signal
    import time

    body = (
        "import sys, time\n"
        "from streamrec.entry import run_command\n"
        "def body():\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "    return 0\n"
        "sys.exit(run_command(body))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", body],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        assert proc.poll() is None, "SIGUSR1 ended the command"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "most recent call first" in err and "in body" in err, err
