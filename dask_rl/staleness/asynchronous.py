"""Pure asynchronous aggregation: every gradient is applied the moment it arrives.

The fastest and least careful baseline of Stellaris' ablation (an asynchronous parameter
server as in Downpour SGD, Dean et al. 2012): ``theta <- theta - alpha0 * g_j`` for each
gradient ``j`` on
arrival, whatever its staleness; no waiting, no correction, weight 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dask_rl.config.schema import AggregationConfig, option
from dask_rl.staleness.base import Decision, Strategy


@dataclass(frozen=True, kw_only=True)
class AsyncConfig(AggregationConfig):
    strategy: Literal["async"] = option("async", "apply every gradient on arrival")


class Async(Strategy):
    config_class = AsyncConfig
    name = "async"

    def decide(self) -> Decision:
        if not self.buffer:
            return Decision()
        # At most one gradient is buffered here: each is applied on arrival.
        return self._aggregate({i: 1.0 for i in self.buffer})
