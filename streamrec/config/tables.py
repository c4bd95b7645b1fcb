"""The sparse tables a model trains: the shared one and those ``sparse_tables`` adds.

Each table is a parameter of its own on the servers (Paddle PS serves one table per
``sparse_embedding`` parameter name), so each has its own width, SGD rule, learning rate,
show/click and eviction settings. A slot's keys live in the table that names it, else in
the shared table ``DEFAULT_SPARSE_TABLE``, which exists only while a slot is left in it.
Two rules keep a key in one table: a slot that hashes its values as another's
(``keys_of``) sits in that slot's table, and (Paddle 2.6 turns probabilistic admission on
for a whole server process, not per table) a table without admission beside one with it
must admit every key it is shown (``nonclk_coeff`` of at least 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamrec.config.model import DEFAULT_SPARSE_TABLE, ModelConfig, SparseTableConfig
from streamrec.config.stream import SchemaConfig


@dataclass(frozen=True)
class SparseTableSpec:
    """One sparse table: its name (the Paddle parameter), width, settings and slots."""

    name: str
    dim: int
    config: SparseTableConfig
    slots: tuple[str, ...]


def sparse_tables(schema: SchemaConfig, model: ModelConfig) -> dict[str, SparseTableSpec]:
    """Every table the model trains, by name: the shared one first (when a slot is left in
    it), then ``sparse_tables`` in their order."""
    hp = model.hyper_parameters
    claimed = {slot for t in hp.sparse_tables.values() for slot in t.slots}
    shared = tuple(s.name for s in schema.sparse if s.name not in claimed)
    tables = {}
    if shared:
        tables[DEFAULT_SPARSE_TABLE] = SparseTableSpec(
            DEFAULT_SPARSE_TABLE, hp.sparse_feature_dim, hp.sparse_table, shared
        )
    for name, t in hp.sparse_tables.items():
        tables[name] = SparseTableSpec(name, t.dim, t, tuple(t.slots))
    return tables


def table_of_slot(schema: SchemaConfig, model: ModelConfig) -> dict[str, str]:
    """Each sparse slot's table."""
    return {slot: t.name for t in sparse_tables(schema, model).values() for slot in t.slots}


def admission_on(schema: SchemaConfig, model: ModelConfig) -> bool:
    """Whether any table admits new keys probabilistically (a flag of the whole server)."""
    return any(t.config.admission for t in sparse_tables(schema, model).values())


def check_tables(schema: SchemaConfig, model: ModelConfig) -> None:
    """ValueError naming the key when the tables do not fit the schema."""
    known = {s.name for s in schema.sparse}
    for name, t in model.hyper_parameters.sparse_tables.items():
        unknown = sorted(set(t.slots) - known)
        if unknown:
            raise ValueError(
                f"model.hyper_parameters.sparse_tables.{name}.slots: {unknown} are not sparse "
                "slots of the schema"
            )
    where = table_of_slot(schema, model)
    for slot in schema.sparse:
        if slot.keys_of is not None and where[slot.name] != where[slot.keys_of]:
            raise ValueError(
                f"slot {slot.name!r} hashes its values as {slot.keys_of!r} (keys_of), so its "
                f"keys are that slot's: put both in one sparse table (now {where[slot.name]} "
                f"and {where[slot.keys_of]})"
            )
    tables = sparse_tables(schema, model)
    if any(spec.config.admission for spec in tables.values()):
        for spec in tables.values():
            if not spec.config.admission and spec.config.nonclk_coeff < 1:
                raise ValueError(
                    f"sparse table {spec.name} has admission off beside a table with it on: "
                    "Paddle 2.6 admits keys by chance on every table of a server once one "
                    f"needs it, with the chance nonclk_coeff per show; set {spec.name}'s "
                    "nonclk_coeff to 1 (every key it is shown enters) or turn its admission on"
                )
