"""TianJi's staleness-following learning rate for the asynchronous learners (PPO, IMPACT).

TianJi (notes, Sec. 3.2, "dynamic learning rate") scales the step by the measured sample
staleness ``P``: ``alpha_eff = alpha / (1 + lambda * P)``. Every gradient is applied the moment
it arrives (TianJi relaxes the learner's dependencies: nothing waits), with the weight
``1 / (1 + lambda * P)`` and the server step ``alpha0``.

**Deviation:** for on-policy learners (no buffer to sample) ``P`` is the share of recently
learned samples that are stale — collected by a policy more than ``lag_tolerance`` versions
older than the parameters the learner started from:

    P = sum_j stale_j / sum_j samples_j    over the last ``window`` gradients, j included,
    stale_j = samples_j if lag_j > lag_tolerance else 0,

``lag_j`` the versions between the policy that collected gradient j's samples and the version
its learner pulled. ``lag_tolerance = 0`` is the strict rule (any lag is stale); it saturates
near 1 when rollouts run beside the learners, since a rollout sampled while the previous
gradient was applied is one version behind. The default 1 counts that unavoidable lag as fresh.
Why, and what was measured: ``docs/decisions/tianji-on-policy-p.md``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Literal

from dask_rl.config.schema import AggregationConfig, option
from dask_rl.staleness.base import Arrival, Decision, Strategy


@dataclass(frozen=True, kw_only=True)
class TianjiConfig(AggregationConfig):
    strategy: Literal["tianji"] = option("tianji", "TianJi: apply on arrival with the step "
                                                   "alpha0 / (1 + lambda P), P the share of "
                                                   "stale samples")
    lam: float = option(1.0, "lambda in alpha0 / (1 + lambda P)", ge=0)
    window: int = option(16, "gradients over which P, the share of stale samples, is "
                             "measured", ge=1)
    lag_tolerance: int = option(1, "versions a sample's policy may lag the learner's "
                                   "parameters and still count as fresh in P", ge=0)


def step_scale(stale_share: float, lam: float) -> float:
    """``1 / (1 + lambda P)``."""
    return 1.0 / (1.0 + lam * stale_share)


class Tianji(Strategy):
    config_class = TianjiConfig
    name = "tianji"

    def __init__(self, cfg, *, learners: int = 1):
        super().__init__(cfg, learners=learners)
        # (samples, stale samples) of the last `window` gradients that reported them
        self.recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=cfg.window)

    @property
    def ratio(self) -> float:
        """P: the share of stale samples over the window (0 before any sample is counted)."""
        samples = sum(n for n, _ in self.recent)
        return sum(s for _, s in self.recent) / samples if samples else 0.0

    def on_gradient(self, arrival: Arrival) -> list[Decision]:
        if arrival.samples > 0 and arrival.version >= self.valid_from:
            stale = arrival.samples if arrival.sample_lag > self.cfg.lag_tolerance else 0
            self.recent.append((arrival.samples, stale))
        return super().on_gradient(arrival)

    def decide(self) -> Decision:
        if not self.buffer:
            return Decision()
        # At most one gradient is buffered here: each is applied on arrival.
        p = self.ratio
        scale = step_scale(p, self.cfg.lam)
        return self._aggregate({i: scale for i in self.buffer}, lr_scale=scale, sample_ratio=p)

    def metrics(self) -> dict:
        m = super().metrics()
        m["tianji/P"] = self.ratio
        return m

    def _extra_state(self) -> dict:
        return {"recent": [list(r) for r in self.recent]}

    def _load_extra_state(self, state: dict) -> None:
        self.recent.clear()
        self.recent.extend((int(n), int(s)) for n, s in state.get("recent", []))
