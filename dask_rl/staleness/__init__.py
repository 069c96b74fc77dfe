"""Gradient aggregation strategies (sans-IO): sync, async, SSP, n-softsync, Stellaris, TianJi.

``aggregation.strategy`` in a pipeline selects one of :data:`STRATEGIES` (or one added with
:func:`register`); :func:`make_strategy` builds it from its validated config. All share the
:class:`~dask_rl.staleness.base.Strategy` interface.
"""

from __future__ import annotations

from typing import Any

from dask_rl.staleness.asynchronous import Async, AsyncConfig
from dask_rl.staleness.base import WAIT, Arrival, Decision, Strategy
from dask_rl.staleness.softsync import Softsync, SoftsyncConfig
from dask_rl.staleness.ssp import SSP, SSPConfig
from dask_rl.staleness.stellaris import Stellaris, StellarisConfig
from dask_rl.staleness.sync import Sync, SyncConfig
from dask_rl.staleness.tianji import Tianji, TianjiConfig

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Sync, Async, SSP, Softsync,
                                                             Stellaris, Tianji)}

__all__ = ["STRATEGIES", "Arrival", "AsyncConfig", "Decision", "SSPConfig", "SoftsyncConfig",
           "StellarisConfig", "Strategy", "SyncConfig", "TianjiConfig", "WAIT", "config_class",
           "make_strategy", "names", "register"]


def register(strategy: type[Strategy]) -> type[Strategy]:
    """Make ``strategy`` available as ``aggregation.strategy: <strategy.name>``."""
    STRATEGIES[strategy.name] = strategy
    return strategy


def names() -> list[str]:
    return list(STRATEGIES)


def config_class(name: str) -> type:
    return STRATEGIES[name].config_class


def make_strategy(cfg: Any, *, learners: int = 1) -> Strategy:
    """The strategy for an aggregation config (its ``strategy`` field names it).

    ``learners`` is the number of learners allowed at once (lambda in n-softsync, the waiting
    bound of Stellaris).
    """
    try:
        cls = STRATEGIES[cfg.strategy]
    except KeyError:
        raise ValueError(f"unknown aggregation strategy {cfg.strategy!r}") from None
    return cls(cfg, learners=learners)
