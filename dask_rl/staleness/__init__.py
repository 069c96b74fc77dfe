"""Gradient aggregation strategies (sans-IO): sync, async, SSP, n-softsync, Stellaris.

``make_strategy(cfg)`` builds the strategy named by ``cfg.strategy``; all share the
:class:`~dask_rl.staleness.base.Strategy` interface.
"""

from __future__ import annotations

from typing import Any

from dask_rl.staleness.asynchronous import Async
from dask_rl.staleness.base import WAIT, Arrival, Decision, Strategy
from dask_rl.staleness.softsync import Softsync
from dask_rl.staleness.ssp import SSP
from dask_rl.staleness.stellaris import Stellaris
from dask_rl.staleness.sync import Sync

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Sync, Async, SSP, Softsync,
                                                             Stellaris)}

__all__ = ["STRATEGIES", "Arrival", "Decision", "Strategy", "WAIT", "make_strategy"]


def make_strategy(cfg: Any, *, learners: int = 1) -> Strategy:
    """The strategy for an aggregation config (its ``strategy`` field names it).

    ``learners`` is the number of learners allowed at once (lambda in n-softsync, the waiting
    bound of Stellaris).
    """
    try:
        cls = STRATEGIES[cfg.strategy]
    except KeyError:
        raise ValueError(f"unknown aggregation strategy {cfg.strategy!r}") from None
    if cls in (Softsync, Stellaris):
        return cls(cfg, learners=learners)
    return cls(cfg)
