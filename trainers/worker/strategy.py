"""Fleet strategy and sparse-table settings from the model config.

Builds the async ``DistributedStrategy`` and maps each sparse table's settings
(``streamrec.config.tables``) onto ``strategy.sparse_table_configs`` (SGD rule and the
accessor's show/click, shrink and delta settings; DESIGN.md says what Paddle does with
each). ``saved_value_layout`` says where the embedding lies in a line the servers save,
which depends on the table's SGD rule; ``sparse_table_ids`` which table id (the folder of
a save) the servers gave each table. ``build_distributed_program`` puts them together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from streamrec.config import ModelConfig, PipelineConfig, SparseTableSpec, sparse_tables
from trainers.hosts import peer_wait
from trainers.models import ModelGraph, build_model

SGD_RULES = {
    "naive": "SparseNaiveSGDRule",
    "adagrad": "SparseAdaGradSGDRule",
    "std_adagrad": "StdAdaGradSGDRule",
    "adam": "SparseAdamSGDRule",
}
_PROTO_SECTION = {"naive": "naive", "adagrad": "adagrad", "std_adagrad": "adagrad", "adam": "adam"}
ACCESSOR = "SparseAccessor"
_LOOKUPS = ("lookup_table", "lookup_table_v2")  # what sparse_embedding writes before fleet
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


def saved_value_layout(table: SparseTableSpec) -> SavedValueLayout:
    """Where ``[embed_w, embedx_w...]`` (the value a lookup pulls) sits in a saved line."""
    return SavedValueLayout(
        embed_w_column=_EMBED_W_COLUMN,
        embedx_w_column=_EMBED_W_COLUMN + 1 + _rule_state_width(table.config.rule, 1),
        embedx_dim=table.dim - 1,
    )


def saved_row_width(table: SparseTableSpec) -> int:
    """Columns of a line the servers save for one key, the key included."""
    layout = saved_value_layout(table)
    state = _rule_state_width(table.config.rule, layout.embedx_dim)
    return layout.embedx_w_column + layout.embedx_dim + state


def sparse_table_ids(program: Any) -> dict[str, int]:
    """Each sparse table's id on the servers (a save keeps table ``i`` in ``<save>/<i:03d>``):
    in a distributed program, read from the lookups the distributed optimizer wrote; in one
    it has not rewritten (the check at start), the ids it will give: the tables in the
    order of their first lookup (Paddle numbers them in the order of their optimizer ops,
    which follow the parameters' creation)."""
    ops = program.global_block().ops
    assigned = {
        op.input("W")[0]: int(op.attr("table_id"))
        for op in ops
        if op.type == "distributed_lookup_table"
    }
    if assigned:
        return assigned
    first = dict.fromkeys(op.input("W")[0] for op in ops if op.type in _LOOKUPS)
    return {name: i for i, name in enumerate(first)}


def table_folder(table_id: int) -> str:
    """The folder of a save that holds table ``table_id``."""
    return f"{table_id:03d}"


def sparse_table_configs(tables: dict[str, SparseTableSpec]) -> dict[str, dict[str, Any]]:
    """``strategy.sparse_table_configs`` for every sparse table."""
    return {name: _table_config(table) for name, table in tables.items()}


def _table_config(table: SparseTableSpec) -> dict[str, Any]:
    t = table.config
    prefix = f"table_parameters.{table.name}"
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
    return conf


def build_strategy(cfg: PipelineConfig) -> Any:
    """The DistributedStrategy for this model's runner and sparse tables."""
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    # sync: the servers apply dense gradients at barriers that ``sync_mode`` drives
    strategy.a_sync = cfg.model.runner.sync_mode != "sync"
    strategy.sparse_table_configs = sparse_table_configs(
        sparse_tables(cfg.feature_schema, cfg.model)
    )
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
    the distributed optimizer: servers and workers build the same one. Members find each
    other without Paddle's naps (``peer_wait``)."""
    import paddle
    from paddle.distributed import fleet

    paddle.enable_static()
    role = peer_wait.member_role()
    if role == "TRAINER":
        peer_wait.wait_listening(peer_wait.gloo_store())
    elif role == "PSERVER":  # server 0 hosts the store; the others never nap there
        peer_wait.shorten_gloo_store_naps()
    fleet.init(is_collective=False)
    if cfg.model.seed is not None:
        seed_programs(cfg.model.seed)
    graph = build_model(cfg.feature_schema, cfg.model)
    optimizer = fleet.distributed_optimizer(build_optimizer(cfg.model), build_strategy(cfg))
    if role == "TRAINER":  # the servers open their ports once they have built the same program
        peer_wait.wait_listening(peer_wait.servers())
    optimizer.minimize(graph.loss)
    return graph
