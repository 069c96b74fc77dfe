"""Algorithms by name: the built-in ones by import path, others registered at run time.

``algo.name`` in a pipeline selects an algorithm here; the config loader takes that
algorithm's config class to validate the ``algo`` section, and the runtime builds the algorithm
from the validated config. Built-in algorithms are imported only when first asked for (as
Gymnasium's ``entry_point`` strings are), so reading a pipeline imports only the one it uses.

Examples
--------
>>> from dask_rl.algos import registry
>>> registry.get("ppo").config_class.__name__
'PPOConfig'
>>> registry.register(MyAlgorithm)      # code outside dask-rl: MyAlgorithm.name = "mine"
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dask_rl.algos.base import Algorithm
    from dask_rl.config.schema import AlgoConfig

#: name -> "module:Class" of the algorithms that ship with dask-rl.
BUILTIN: dict[str, str] = {
    "ppo": "dask_rl.algos.ppo:PPO",
    "impact": "dask_rl.algos.impact:IMPACT",
    "es": "dask_rl.algos.es:ES",
    "dqn": "dask_rl.algos.dqn:DQN",
}

_REGISTERED: dict[str, type["Algorithm"]] = {}


def register(algorithm: type["Algorithm"]) -> type["Algorithm"]:
    """Make ``algorithm`` available as ``algo.name: <algorithm.name>`` (usable as a decorator).

    Its module must be importable wherever the run's tasks execute (an installed package, or
    code the cluster already has): workers find the algorithm through the pipeline's config,
    whose class lives in that module.
    """
    name = algorithm.name
    if name in BUILTIN:
        raise ValueError(f"algorithm name {name!r} is taken by a built-in algorithm")
    if algorithm.config_class.__dataclass_fields__["name"].default != name:
        raise ValueError(f"{algorithm.__name__}.config_class must default its name to {name!r}")
    _REGISTERED[name] = algorithm
    return algorithm


def unregister(name: str) -> None:
    """Forget an algorithm :func:`register` added (built-ins stay)."""
    if name not in BUILTIN:
        _REGISTERED.pop(name, None)


def get(name: str) -> type["Algorithm"]:
    """The algorithm registered as ``name``; KeyError names the ones that exist."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in BUILTIN:
        raise KeyError(f"unknown algorithm {name!r} (known: {', '.join(names())})")
    module, _, attr = BUILTIN[name].partition(":")
    algorithm = getattr(importlib.import_module(module), attr)
    _REGISTERED[name] = algorithm
    return algorithm


def config_class(name: str) -> type["AlgoConfig"]:
    return get(name).config_class


def names() -> list[str]:
    """Built-in algorithms first, in their declared order, then registered ones."""
    return [*BUILTIN, *(n for n in _REGISTERED if n not in BUILTIN)]


def build(cfg: "AlgoConfig") -> "Algorithm":
    """The algorithm for a validated ``algo`` config."""
    return get(cfg.name)(cfg)
