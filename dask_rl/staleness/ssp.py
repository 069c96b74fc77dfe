"""Stale-synchronous parallel (Ho et al., NeurIPS'13) on a versioned parameter server.

SSP bounds staleness by making *fast* workers wait for slow ones: no learner may see the
parameters run more than ``bound`` (s) versions ahead of the version it pulled. Here that is a
gate on updates. A gradient is applied on arrival (weight 1, one update) unless the update
would leave a learner that is still computing more than ``s`` versions behind, i.e. unless
``version + 1 - min_pulled > s``; then it waits. When the gate opens again (the slowest learner
pushed or was reported lost), everything waiting is averaged into one update, so each of those
gradients is applied with the staleness it arrived with. Every applied gradient therefore has
staleness <= s, and ``s = 0`` is a synchronous barrier. A gradient staler than ``s`` all the
same (possible only after a recovery restored an older version) is dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dask_rl.config.schema import AggregationConfig, option
from dask_rl.staleness.base import WAIT, Decision, Strategy


@dataclass(frozen=True, kw_only=True)
class SSPConfig(AggregationConfig):
    strategy: Literal["ssp"] = option("ssp", "stale-synchronous parallel: updates wait so that "
                                             "no learner falls more than `bound` versions "
                                             "behind")
    bound: int = option(3, "staleness bound s", ge=0)


class SSP(Strategy):
    config_class = SSPConfig
    name = "ssp"

    @property
    def bound(self) -> int:
        return self.cfg.bound

    def gate_open(self) -> bool:
        """Whether one more update keeps every computing learner within the bound."""
        if not self.active:
            return True
        return self.version + 1 - min(self.active.values()) <= self.bound

    def decide(self) -> Decision:
        too_stale = tuple(i for i, a in self.buffer.items() if self.staleness(a) > self.bound)
        if too_stale:
            return self._drop(too_stale)
        if not self.buffer or not self.gate_open():
            return WAIT
        h = len(self.buffer)
        return self._aggregate({i: 1.0 / h for i in self.buffer})
