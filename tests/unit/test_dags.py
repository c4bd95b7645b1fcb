"""Every DAG file imports without errors, the pass DAG has the documented shape, and its
schedule (as the scheduler computes it) gives one run per pass window, in order, with
catch-up from ``schedule.start``."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml


@pytest.fixture(autouse=True)
def shipped_config_path(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The DAG file reads ``STREAMREC_CONFIG`` when parsed: the shipped config, undone after."""
    path = repo / "configs" / "pipeline.yaml"
    monkeypatch.setenv("STREAMREC_CONFIG", str(path))
    return path


def _shipped(repo: Path) -> dict:
    """The shipped config's YAML, with its schema and model at absolute paths."""
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    raw["schema"] = str(repo / "configs" / "schema.yaml")
    raw["model"] = str(repo / "configs" / "models" / "ctr_dnn.yaml")
    return raw


def _driving(repo: Path) -> dict:
    """The shipped config with each DAG run driving its pass (``cluster.follow_passes`` off)."""
    raw = _shipped(repo)
    raw["cluster"]["follow_passes"] = False
    return raw


def _use(raw: dict, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write ``raw`` to ``path`` and point the DAG file at it."""
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("STREAMREC_CONFIG", str(path))


@pytest.mark.parametrize("follow, first", [(True, "watch_pass"), (False, "wait_pass")])
def test_passes_cut_from_the_served_log_are_judged_online_beside_training(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, follow: bool, first: str
) -> None:
    raw = _shipped(repo)
    raw["cluster"]["follow_passes"] = follow
    raw["passes"]["cut_from"] = "served_log"
    raw.setdefault("serving", {})["log_topic"] = "served"
    _use(raw, tmp_path / "served.yaml", monkeypatch)
    dag = _bag(repo)
    down = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    assert "judge_online" in down[first]
    assert down["judge_online"] == set()  # beside training, never holding delivery


def test_as_shipped_the_cluster_follows_the_passes_and_each_run_watches_its_pass(
    repo: Path,
) -> None:
    dag = _bag(repo)
    down = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    assert down == {"watch_pass": {"delivered"}, "delivered": set()}
    assert {t.task_id for t in dag.tasks if t.outlets} == {"delivered"}
    assert dag.get_task("watch_pass").timeout >= 3600
    assert dag.catchup and dag.max_active_runs == 1


def _bag(repo: Path):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(repo / "dags"))
    assert bag.import_errors == {}
    return bag.dags["streamrec_pass"]  # from the parsed files, no metadata DB needed


def test_with_runs_driving_the_passes_the_dag_has_a_task_per_step(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(_driving(repo), tmp_path / "driving.yaml", monkeypatch)
    dag = _bag(repo)
    assert set(dag.task_ids) == {
        "wait_pass",
        "train_pass",
        "evaluate",
        "export",
        "deliver",
        "day_end",
        "catch_up",
        "deliver_newest",
    }
    down = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    # the pass is delivered right after its gate decision; the day-end and catch-up steps
    # come after, and the day's end runs whether the pass was delivered or skipped
    assert down["wait_pass"] == {"train_pass", "export", "day_end", "catch_up"}
    assert down["train_pass"] == {"evaluate"}
    assert down["evaluate"] == {"export", "catch_up"}
    assert down["export"] == {"deliver"}
    assert down["deliver"] == {"day_end"}
    assert down["day_end"] == {"catch_up"}
    assert down["catch_up"] == {"deliver_newest"}
    assert dag.get_task("day_end").trigger_rule == "none_failed_min_one_success"
    assert {t.task_id for t in dag.tasks if t.outlets} == {"deliver", "deliver_newest"}
    assert dag.catchup and dag.max_active_runs == 1
    assert all(t.retries >= 1 and t.depends_on_past for t in dag.tasks)
    assert {t.owner for t in dag.tasks} == {"streamrec"}  # schedule.owner, not Airflow's default
    assert dag.get_task("wait_pass").timeout >= 3600


def test_runs_are_pass_windows_from_the_start_with_catch_up(
    repo: Path, shipped_config_path: Path
) -> None:
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import DataInterval, TimeRestriction

    from streamrec.config import load_config

    cfg = load_config(shipped_config_path)
    dag = _bag(repo)
    timetable = coerce_to_core_timetable(dag.timetable)
    restriction = TimeRestriction(earliest=dag.start_date, latest=None, catchup=True)
    first = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    window = timedelta(seconds=cfg.passes.clock.seconds)
    assert first.data_interval.start == cfg.schedule.start  # the shipped start is a boundary
    assert first.data_interval.end - first.data_interval.start == window
    # long after the start (an outage): the next run is the very next window, not "now"
    nxt = timetable.next_dagrun_info(
        last_automated_data_interval=DataInterval(
            first.data_interval.start, first.data_interval.end
        ),
        restriction=restriction,
    )
    assert nxt.data_interval.start == first.data_interval.end
    assert cfg.passes.clock.id_of(nxt.data_interval.start) == "202601010010"


def test_dag_without_schedule_section_fails_naming_the_key(repo: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    del raw["schedule"]
    raw["schema"] = str(repo / "configs" / "schema.yaml")
    raw["model"] = str(repo / "configs" / "models" / "ctr_dnn.yaml")
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump(raw))
    probe = subprocess.run(
        [sys.executable, str(repo / "dags" / "streamrec_pass.py")],
        env={**os.environ, "STREAMREC_CONFIG": str(config)},
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0
    assert "missing section 'schedule'" in probe.stderr and "start" in probe.stderr


def test_dag_parses_with_only_its_own_secrets_set(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler and the DAG's tasks never read the serving token, and parsing the DAG
    reads no secret at all: a secret is checked where a process reads it."""
    raw = _driving(repo)  # the mode whose tasks read the most
    raw["redis"] = {**raw["redis"], "url": "redis://db:6379/0", "password_env": "SR_TEST_PW"}
    raw["serving"] = {**raw.get("serving", {}), "bearer_token_env": "SR_TEST_TOKEN"}
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("SR_TEST_TOKEN", raising=False)
    monkeypatch.delenv("SR_TEST_PW", raising=False)
    monkeypatch.setenv("STREAMREC_CONFIG", str(config))
    assert "train_pass" in _bag(repo).task_ids
