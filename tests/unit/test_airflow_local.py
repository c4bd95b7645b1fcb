"""The environment Airflow's local services start with: the pipeline's own settings always,
the tuning as defaults that an operator's ``AIRFLOW__`` variables override."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.airflow_local import TUNING, LocalAirflow

IDLE_SLEEP = "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"


def test_tuning_is_a_default_the_environment_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow = LocalAirflow(tmp_path / "airflow", tmp_path / "pipeline.yaml")
    monkeypatch.delenv(IDLE_SLEEP, raising=False)
    assert airflow.env()[IDLE_SLEEP] == TUNING[IDLE_SLEEP]
    monkeypatch.setenv(IDLE_SLEEP, "3")
    assert airflow.env()[IDLE_SLEEP] == "3"


def test_the_pipeline_settings_are_not_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow = LocalAirflow(tmp_path / "airflow", tmp_path / "pipeline.yaml")
    monkeypatch.setenv("AIRFLOW_HOME", "/elsewhere")
    monkeypatch.setenv("STREAMREC_CONFIG", "/elsewhere.yaml")
    env = airflow.env()
    assert env["AIRFLOW_HOME"] == str(tmp_path / "airflow")
    assert env["STREAMREC_CONFIG"] == str(tmp_path / "pipeline.yaml")
