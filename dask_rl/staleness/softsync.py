"""n-softsync (Zhang, Gupta, Lian & Liu, IJCAI'16, arXiv:1511.05950).

With lambda learners, the server updates after every ``c = max(1, floor(lambda / n))``
gradients, averaging them, with the learning rate divided by their mean staleness:
``alpha = alpha0 / <tau>`` (Sec. 3, the n-softsync protocol and its staleness-dependent
learning rate). The mean-staleness form is used for the whole group (the reading of the
Stellaris ablation's baseline); a per-gradient ``alpha0 / tau_l`` would differ when the
group's gradients are unequally stale (a test pins the mean form). ``n = 1`` waits for lambda
gradients (close to synchronous), ``n = lambda`` updates on every gradient (asynchronous with
a staleness-scaled step). Gradients fresher than one version (tau = 0) count as tau = 1, so
the step never exceeds alpha0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dask_rl.config.schema import AggregationConfig, option
from dask_rl.staleness.base import Decision, Strategy


@dataclass(frozen=True, kw_only=True)
class SoftsyncConfig(AggregationConfig):
    strategy: Literal["softsync"] = option("softsync", "n-softsync: update every "
                                                       "floor(learners / n) gradients, step "
                                                       "alpha0 / mean staleness")
    n: int = option(2, "the n of n-softsync", ge=1)


class Softsync(Strategy):
    config_class = SoftsyncConfig
    name = "softsync"

    @property
    def group(self) -> int:
        return max(1, math.floor(self.learners / self.cfg.n))

    def decide(self) -> Decision:
        if len(self.buffer) < self.group:
            return Decision()
        ids = list(self.buffer)[:self.group]
        taus = [self.staleness(self.buffer[i]) for i in ids]
        mean_tau = max(1.0, sum(taus) / len(taus))
        weight = 1.0 / (len(ids) * mean_tau)
        return self._aggregate({i: weight for i in ids}, lr_scale=1.0 / mean_tau)
