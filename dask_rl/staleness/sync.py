"""Synchronous aggregation: a barrier over a round's learners, one averaged step.

The baseline of Stellaris' ablation and of synchronous (distributed) PPO: ``theta_{k+1} =
theta_k - alpha0 * (1/H) sum_j g_j`` over the ``H`` gradients of round ``k``, all computed on
``theta_k``. The barrier waits for every learner of the round: the driver announces them when
it starts the round's rollouts (:meth:`~dask_rl.staleness.base.Strategy.on_learner_expected`),
so a learner whose trajectory is not even collected yet is waited for, and a lost one releases
it. With the driver's rollout gating (``synchronous = True``) every learner of a round pulls
``theta_k``, so every staleness is 0 (a test checks it over 50 rounds on a cluster).
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
