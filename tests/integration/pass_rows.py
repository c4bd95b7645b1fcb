"""A built pass as the tests compare it: its rows as the impression events a client sends,
and the cluster's own inference on them (``ClusterClient.score``), in the same order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.parquet as pq

from streamrec.config import PipelineConfig
from streamrec.passes import pass_dir, read_manifest
from trainers.control_plane import ClusterClient


def pass_events(cfg: PipelineConfig, pass_id: str) -> list[dict[str, Any]]:
    """The rows of a pass as impression events."""
    directory = pass_dir(cfg.paths.data_root, pass_id)
    schema = cfg.feature_schema
    return [
        {
            "event_id": row["event_id"],
            "sparse": {s.name: row[s.name] for s in schema.sparse},
            "dense": {d.name: row[d.name] for d in schema.dense},
        }
        for part in read_manifest(directory).parts
        for row in pq.read_table(directory / part.file).to_pylist()
    ]


def cluster_scores(client: ClusterClient, pass_id: str, events: list[dict[str, Any]]) -> np.ndarray:
    """The cluster's predictions for ``events`` (rows of ``pass_id``), in their order."""
    by_id: dict[str, float] = {}
    for result in client.score(pass_id):
        table = pq.read_table(result.predictions).to_pydict()
        by_id.update(zip(table["event_id"], table["p_click"], strict=True))
    assert len(by_id) == len(events)
    return np.array([by_id[e["event_id"]] for e in events])


def cluster_task_scores(
    client: ClusterClient, pass_id: str, events: list[dict[str, Any]]
) -> dict[str, np.ndarray]:
    """Each head's predictions for ``events`` (rows of ``pass_id``), in their order, by the
    score's column: ``p_click`` for the main task, ``p_<label>`` for a further one."""
    tables = [pq.read_table(r.predictions).to_pydict() for r in client.score(pass_id)]
    order = {e["event_id"]: i for i, e in enumerate(events)}
    out: dict[str, np.ndarray] = {}
    for table in tables:
        rows = [order[event_id] for event_id in table["event_id"]]
        for column, values in table.items():
            if column != "event_id":
                out.setdefault(column, np.full(len(events), np.nan))[rows] = values
    assert all(not np.isnan(v).any() for v in out.values()), "a row the cluster did not score"
    return out
