"""Every DAG file imports without errors, and the pass DAG has the documented shape."""

from __future__ import annotations

from pathlib import Path


def test_dags_import_and_pass_dag_shape(repo: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(repo / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["streamrec_pass"]  # from the parsed files, no metadata DB needed
    assert set(dag.task_ids) == {
        "wait_pass",
        "train_pass",
        "evaluate",
        "maintain",
        "export",
        "deliver",
    }
    down = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    assert down["wait_pass"] == {"train_pass", "maintain", "export"}
    assert down["train_pass"] == {"evaluate"}
    assert down["evaluate"] == {"maintain", "export"}
    assert down["maintain"] == {"export"}
    assert down["export"] == {"deliver"}
    assert dag.get_task("wait_pass").mode == "reschedule"
    assert all(t.retries >= 1 for t in dag.tasks)
