"""Fleet strategy and sparse-table settings from the model config.

Builds the async ``DistributedStrategy`` and maps ``hyper_parameters.sparse_table`` onto
``strategy.sparse_table_configs`` for the shared table (SGD rule and the accessor's
show/click, shrink and delta settings; DESIGN.md says what Paddle does with each).
``saved_value_layout`` says where the embedding lies in a line the servers save, which
depends on the sparse SGD rule. ``build_distributed_program`` puts them together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from streamrec.config import ModelConfig, PipelineConfig
from trainers.models import SPARSE_TABLE, ModelGraph, build_model

SGD_RULES = {
    "naive": "SparseNaiveSGDRule",
    "adagrad": "SparseAdaGradSGDRule",
    "std_adagrad": "StdAdaGradSGDRule",
    "adam": "SparseAdamSGDRule",
}
_PROTO_SECTION = {"naive": "naive", "adagrad": "adagrad", "std_adagrad": "adagrad", "adam": "adam"}
ACCESSOR = "SparseAccessor"
# A SparseAccessor line: key slot unseen_days delta_score show click embed_w ...
UNSEEN_DAYS_COLUMN = 2
_EMBED_W_COLUMN = 6


def _rule_state_width(rule: str, dim: int) -> int:
    """Optimizer state values the server saves after the weights of one embedding part."""
    return {"naive": 0, "adagrad": 1, "std_adagrad": dim, "adam": 2 * dim + 2}[rule]


@dataclass(frozen=True)
class SavedValueLayout:
    """Columns of the pulled embedding in a saved sparse line (0 = the key)."""

    embed_w_column: int
    embedx_w_column: int
    embedx_dim: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def saved_value_layout(model: ModelConfig) -> SavedValueLayout:
    """Where ``[embed_w, embedx_w...]`` (the value a lookup pulls) sits in a saved line."""
    table = model.hyper_parameters.sparse_table
    embedx_dim = model.hyper_parameters.sparse_feature_dim - 1
    return SavedValueLayout(
        embed_w_column=_EMBED_W_COLUMN,
        embedx_w_column=_EMBED_W_COLUMN + 1 + _rule_state_width(table.rule, 1),
        embedx_dim=embedx_dim,
    )


def saved_row_width(model: ModelConfig) -> int:
    """Columns of a line the servers save for one key, the key included."""
    layout = saved_value_layout(model)
    rule = model.hyper_parameters.sparse_table.rule
    return layout.embedx_w_column + layout.embedx_dim + _rule_state_width(rule, layout.embedx_dim)


def sparse_table_configs(model: ModelConfig) -> dict[str, dict[str, Any]]:
    """``strategy.sparse_table_configs`` for the shared sparse table."""
    t = model.hyper_parameters.sparse_table
    prefix = f"table_parameters.{SPARSE_TABLE}"
    acc = f"{prefix}.accessor"
    section = _PROTO_SECTION[t.rule]
    conf: dict[str, Any] = {
        f"{prefix}.shard_num": t.shard_num,
        f"{acc}.accessor_class": ACCESSOR,
        f"{acc}.embedx_threshold": t.embedx_threshold,
    }
    ctr = f"{acc}.ctr_accessor_param"
    conf.update(
        {
            f"{ctr}.nonclk_coeff": t.nonclk_coeff,
            f"{ctr}.click_coeff": t.click_coeff,
            f"{ctr}.show_click_decay_rate": t.show_click_decay_rate,
            f"{ctr}.delete_threshold": t.delete_threshold,
            f"{ctr}.delete_after_unseen_days": t.delete_after_unseen_days,
            # A delta checkpoint must hold every key touched since the last save, whatever
            # its total score: no base threshold, only the growth of the delta score.
            f"{ctr}.base_threshold": 0.0,
            f"{ctr}.delta_threshold": t.delta_threshold,
            f"{ctr}.delta_keep_days": t.delta_keep_days,
        }
    )
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        conf[f"{acc}.{part}.name"] = SGD_RULES[t.rule]
        conf[f"{acc}.{part}.{section}.learning_rate"] = t.learning_rate
        conf[f"{acc}.{part}.{section}.initial_range"] = t.initial_range
    return {SPARSE_TABLE: conf}


def build_strategy(model: ModelConfig) -> Any:
    """The DistributedStrategy for this model's runner and sparse table."""
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    # sync: the servers apply dense gradients at barriers that ``sync_mode`` drives
    strategy.a_sync = model.runner.sync_mode != "sync"
    strategy.sparse_table_configs = sparse_table_configs(model)
    return strategy


def build_optimizer(model: ModelConfig) -> Any:
    """The dense optimizer named in the model config."""
    import paddle

    opt = model.hyper_parameters.optimizer
    classes = {"adam": paddle.optimizer.Adam, "sgd": paddle.optimizer.SGD}
    return classes[opt.class_](learning_rate=opt.learning_rate)


def seed_programs(seed: int) -> None:
    """Seed the programs about to be built: every initializer and random op whose own seed
    is 0 takes the program's ``random_seed``, and ``paddle.seed`` the generator behind the
    rest. Worker 0 pushes its initial dense values to the servers (``init_worker``), so
    its seed decides every worker's start."""
    import paddle

    paddle.seed(seed)
    paddle.static.default_startup_program().random_seed = seed
    paddle.static.default_main_program().random_seed = seed


def build_distributed_program(cfg: PipelineConfig) -> ModelGraph:
    """Join the fleet in this process's PS role and build the model's program, minimised by
    the distributed optimizer: servers and workers build the same one."""
    import paddle
    from paddle.distributed import fleet

    paddle.enable_static()
    fleet.init(is_collective=False)
    if cfg.model.seed is not None:
        seed_programs(cfg.model.seed)
    graph = build_model(cfg.feature_schema, cfg.model)
    optimizer = fleet.distributed_optimizer(build_optimizer(cfg.model), build_strategy(cfg.model))
    optimizer.minimize(graph.loss)
    return graph
