"""Pure algorithm math: losses, targets, updates. No Dask, no I/O, explicit RNGs."""

from __future__ import annotations

from types import ModuleType

__all__ = ["get_algorithm"]


def get_algorithm(name: str) -> ModuleType:
    """The module implementing a gradient-based algorithm (``prepare`` and ``loss``)."""
    if name == "ppo":
        from dask_rl.algos import ppo

        return ppo
    if name == "impact":
        from dask_rl.algos import impact

        return impact
    raise ValueError(f"unknown algorithm {name!r}")
