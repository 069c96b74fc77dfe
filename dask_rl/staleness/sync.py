"""Synchronous aggregation: a barrier over the active learners, one averaged step.

The baseline of Stellaris' ablation and of synchronous PPO: every gradient waits until no
learner that is still computing could join the round, then all buffered gradients are averaged
(weight 1/H each) into one update. With the driver's rollout gating (``synchronous = True``),
all learners of a round pulled the same version, so staleness is always 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dask_rl.config.schema import AggregationConfig, option
from dask_rl.staleness.base import WAIT, Decision, Strategy


@dataclass(frozen=True, kw_only=True)
class SyncConfig(AggregationConfig):
    strategy: Literal["sync"] = option("sync", "barrier over the active learners, average, "
                                               "one step")


class Sync(Strategy):
    config_class = SyncConfig
    name = "sync"
    synchronous = True

    def decide(self) -> Decision:
        if not self.buffer or self.active:
            return WAIT
        h = len(self.buffer)
        return self._aggregate({i: 1.0 / h for i in self.buffer})
