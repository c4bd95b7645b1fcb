"""Several sparse tables: which slot lives in which table, each table's settings reaching
the strategy and the program, its width in the saved layout, and every way a config can
get the tables wrong failing at load with the key named."""

from __future__ import annotations

from typing import Any

import pytest

from streamrec.config import (
    DEFAULT_SPARSE_TABLE,
    PipelineConfig,
    admission_on,
    derived,
    sparse_tables,
    table_of_slot,
)
from streamrec.errors import ConfigError
from trainers.models import build_model
from trainers.worker.strategy import sparse_table_configs, sparse_table_ids

SMALL = {"dim": 4, "slots": ["hour", "category"], "learning_rate": 0.2, "rule": "naive"}


def _two_tables(cfg: PipelineConfig, **small: Any) -> PipelineConfig:
    return derived(
        cfg,
        "test",
        model={
            "hyper_parameters": {
                "sparse_feature_dim": 16,
                "sparse_table": {"delete_after_unseen_days": 2},
                "sparse_tables": {"small": {**SMALL, **small}},
            }
        },
    )


def test_slots_go_to_the_table_naming_them_and_the_rest_share_one(shipped_config) -> None:
    cfg = _two_tables(shipped_config)
    tables = sparse_tables(cfg.feature_schema, cfg.model)
    assert list(tables) == [DEFAULT_SPARSE_TABLE, "small"]
    assert tables[DEFAULT_SPARSE_TABLE].slots == ("user_id", "item_id", "tags")
    assert tables["small"].slots == ("hour", "category")  # in the table's own order
    assert (tables[DEFAULT_SPARSE_TABLE].dim, tables["small"].dim) == (16, 4)
    assert table_of_slot(cfg.feature_schema, cfg.model)["category"] == "small"
    configs = sparse_table_configs(tables)
    small = configs["small"]
    assert small["table_parameters.small.accessor.embed_sgd_param.name"] == "SparseNaiveSGDRule"
    assert small["table_parameters.small.accessor.embedx_sgd_param.naive.learning_rate"] == 0.2
    shared = configs[DEFAULT_SPARSE_TABLE]
    key = f"table_parameters.{DEFAULT_SPARSE_TABLE}.accessor.ctr_accessor_param"
    assert shared[f"{key}.delete_after_unseen_days"] == 2
    assert (
        small["table_parameters.small.accessor.ctr_accessor_param.delete_after_unseen_days"] == 30
    )
    every = {s.name for s in cfg.feature_schema.sparse}
    alone = _two_tables(shipped_config, slots=sorted(every))
    assert list(sparse_tables(alone.feature_schema, alone.model)) == ["small"]  # none shared


def test_the_program_looks_each_slot_up_in_its_table_at_its_width(
    shipped_config, static_program
) -> None:
    cfg = _two_tables(shipped_config)
    build_model(cfg.feature_schema, cfg.model)
    lookups = [op for op in static_program.global_block().ops if op.type.startswith("lookup")]
    table = {op.input("Ids")[0]: op.input("W")[0] for op in lookups}
    assert table == {
        s.name: ("small" if s.name in SMALL["slots"] else DEFAULT_SPARSE_TABLE)
        for s in cfg.feature_schema.sparse
    }
    shape = {p.name: list(p.shape) for p in static_program.all_parameters()}
    assert (shape[DEFAULT_SPARSE_TABLE][1], shape["small"][1]) == (16, 4)
    # before fleet rewrites the lookups: the ids in order of first lookup (user_id first)
    assert sparse_table_ids(static_program) == {DEFAULT_SPARSE_TABLE: 0, "small": 1}


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"small": {**SMALL, "slots": ["hour", "no_such"]}}, "sparse_tables.small.slots"),
        ({"a": {**SMALL, "slots": ["hour"]}, "b": {**SMALL, "slots": ["hour"]}}, "more than one"),
        ({"with.dot": SMALL}, "letters, digits"),
        ({DEFAULT_SPARSE_TABLE: SMALL}, "other than"),
        ({"small": {**SMALL, "dim": 1}}, "sparse_tables.small.dim"),
        ({"small": {**SMALL, "admission": True}}, "nonclk_coeff to 1"),
    ],
)
def test_a_bad_table_fails_at_load_naming_it(shipped_config, tables, message) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        derived(shipped_config, "test", model={"hyper_parameters": {"sparse_tables": tables}})
    assert e.value.exit_code == 2


def test_admission_is_per_table_where_paddle_allows(shipped_config) -> None:
    cfg = derived(
        shipped_config,
        "test",
        model={
            "hyper_parameters": {
                "sparse_table": {"nonclk_coeff": 1.0, "delta_threshold": 1e-4},
                "sparse_tables": {"small": {**SMALL, "admission": True}},
            }
        },
    )
    assert admission_on(cfg.feature_schema, cfg.model)
    assert not admission_on(shipped_config.feature_schema, shipped_config.model)


def test_a_slot_and_the_slot_it_takes_keys_from_share_a_table(shipped_config) -> None:
    data = shipped_config.model_dump(mode="json", by_alias=True)
    data["schema"]["sparse"].append({"name": "seen_items", "multi": True, "keys_of": "item_id"})
    data["model"]["hyper_parameters"]["sparse_tables"] = {"items": {**SMALL, "slots": ["item_id"]}}
    with pytest.raises(ValueError, match="put both in one sparse table"):
        PipelineConfig.model_validate(data)
    data["model"]["hyper_parameters"]["sparse_tables"]["items"]["slots"].append("seen_items")
    PipelineConfig.model_validate(data)
