"""Gradient aggregation strategies (sans-IO): sync, async, SSP, n-softsync, Stellaris.

``make_strategy(cfg)`` builds the strategy named by ``cfg.strategy``; all share the
:class:`~dask_rl.staleness.base.Strategy` interface.
"""

from __future__ import annotations

from typing import Any

from dask_rl.staleness.asynchronous import Async
from dask_rl.staleness.base import WAIT, Arrival, Decision, Strategy
from dask_rl.staleness.sync import Sync

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Sync, Async)}

__all__ = ["STRATEGIES", "Arrival", "Decision", "Strategy", "WAIT", "make_strategy"]


def make_strategy(cfg: Any) -> Strategy:
    """The strategy for an aggregation config (its ``strategy`` field names it)."""
    try:
        cls = STRATEGIES[cfg.strategy]
    except KeyError:
        raise ValueError(f"unknown aggregation strategy {cfg.strategy!r}") from None
    return cls(cfg)
