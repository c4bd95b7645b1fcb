"""Load the network a model YAML names (``model.network``, the model API of
``streamrec.network``): import it, validate its hyper-parameters, make it. Every failure is
a ConfigError (exit 2) naming the key and the fix."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from streamrec.config import ModelConfig, SchemaConfig
from streamrec.errors import ConfigError, broken_fields
from streamrec.network import MultiTaskNetwork, Network, NetworkFactory, NetworkNeeds, NoParams

# the classes behind the names a model YAML may give (``streamrec.network.SHIPPED``; a
# unit test holds the two to the same names)
SHIPPED_NETWORKS = {
    "ctr_dnn": "trainers.networks:CtrDnn",
    "wide_deep": "trainers.networks:WideDeep",
    "deepfm": "trainers.networks:DeepFM",
}


def network_path(model: ModelConfig) -> str:
    """The network's import path, 'module:Class' (a shipped network's name resolved)."""
    return SHIPPED_NETWORKS.get(model.network_name, model.network_name)


def importable_here() -> None:
    """Let a network module in the folder streamrec started in import (as uvicorn lets an
    app): the folder goes to sys.path and, with every PYTHONPATH entry made absolute, to
    PYTHONPATH for the cluster's processes, which run in another folder."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([cwd, *paths]))


def network_factory(model: ModelConfig) -> NetworkFactory:
    """The class (or callable) ``model.network`` names."""
    path = network_path(model)
    module_name, _, attr = path.partition(":")
    importable_here()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"model.network: cannot import {module_name!r} ({e}): install its package or "
            "put its folder on PYTHONPATH"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(
            f"model.network: {module_name!r} has no class {attr!r}: name the network's class "
            "as 'module:Class'"
        )
    params = getattr(factory, "Params", NoParams)
    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise ConfigError(
            f"model.network: {path}.Params is {params!r}, not a pydantic model: declare the "
            "hyper-parameters as 'class Params(pydantic.BaseModel)'"
        )
    return factory


def network_params(model: ModelConfig, factory: NetworkFactory) -> BaseModel:
    """The network's hyper-parameters from the YAML's ``hyper_parameters`` block."""
    schema: type[BaseModel] = getattr(factory, "Params", NoParams)
    given = model.hyper_parameters.network_params
    unknown = sorted(set(given) - set(schema.model_fields))
    if unknown:
        raise ConfigError(
            f"model.hyper_parameters.{unknown[0]}: {network_path(model)} declares no such "
            f"hyper-parameter (it has: {', '.join(schema.model_fields) or 'none'}): remove "
            "it or fix its spelling"
        )
    try:
        return schema.model_validate(given)
    except ValidationError as e:
        raise ConfigError(
            "model.hyper_parameters."
            + broken_fields(e).replace("; ", "; model.hyper_parameters.")
            + f" (declared by {network_path(model)}.Params)"
        ) from None


def network_needs(model: ModelConfig) -> NetworkNeeds:
    """What the network declares it reads (``needs(params)``; nothing when it declares
    nothing)."""
    factory = network_factory(model)
    declare = getattr(factory, "needs", None)
    if declare is None:
        return NetworkNeeds()
    needs = declare(network_params(model, factory))
    if not isinstance(needs, NetworkNeeds):
        raise ConfigError(
            f"model.network: {network_path(model)}.needs(params) returned "
            f"{type(needs).__name__}, not a streamrec.network.NetworkNeeds"
        )
    return needs


def check_network_fits(schema: SchemaConfig, model: ModelConfig) -> None:
    """The network's declared needs against the feature schema: ConfigError (exit 2)
    naming the slot or label the network cannot have, and the fix."""
    needs, net = network_needs(model), network_path(model)
    slots = {s.name: s for s in schema.sparse}
    for name in needs.sequences:
        slot = slots.get(name)
        if slot is None:
            raise ConfigError(
                f"schema.sparse: {net} reads the slot {name!r} as a sequence, and the schema "
                f"has no slot {name!r}: add it (multi: true, pooling: sequence, max_length: "
                "N) or point the network's hyper-parameter at a sequence slot"
            )
        if slot.pooling != "sequence":
            raise ConfigError(
                f"schema.sparse.{name}.pooling: {net} reads the slot {name!r} as a sequence, "
                f"and it has pooling {slot.pooling}: set pooling: sequence and max_length on "
                "it, or point the network's hyper-parameter at a sequence slot"
            )
    for name in needs.pooled:
        slot = slots.get(name)
        if slot is None or slot.pooling == "sequence":
            what = "has no such slot" if slot is None else "has it as a sequence"
            raise ConfigError(
                f"schema.sparse: {net} reads the slot {name!r} pooled, and the schema {what}: "
                "point the network's hyper-parameter at a slot pooled by sum or mean"
            )
    labels = [x.name for x in schema.labels]
    for name in needs.labels:
        if name not in labels:
            raise ConfigError(
                f"schema.labels: {net} heads the label {name!r}, which the schema does not "
                f"carry (it has {', '.join(labels)}): add it to schema.labels, or name one of "
                "those in the network's hyper-parameters"
            )
    if needs.dense and not schema.dense:
        raise ConfigError(
            f"schema.dense: {net} reads the dense features, and the schema has none: add "
            "them to schema.dense"
        )


def load_network(model: ModelConfig) -> Network | MultiTaskNetwork:
    """The network the model YAML names, made with its hyper-parameters."""
    factory = network_factory(model)
    params = network_params(model, factory)
    try:
        network: Any = factory(params)
    except Exception as e:  # the user's constructor: any failure is a config failure
        raise ConfigError(f"model.network: {network_path(model)}(params) failed: {e!r}") from e
    if not isinstance(network, Network | MultiTaskNetwork):
        raise ConfigError(
            f"model.network: {network_path(model)}(params) made a {type(network).__name__} "
            "without a logit(inputs) method (streamrec.network.Network) or a "
            "logits(inputs) one (streamrec.network.MultiTaskNetwork)"
        )
    return network
