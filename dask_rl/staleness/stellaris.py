"""Stellaris' staleness-aware aggregation (Yu et al., SC'24, "Staleness-Aware Gradient
Aggregation").

* **Dynamic threshold** ``beta_k = delta_max * d^k``: ``delta_max`` is the largest staleness
  seen in the first round in which any gradient was stale (the paper: "the maximum staleness
  observed in the first round"), ``k`` the rounds since (the paper's ``k`` is the training
  round; counting from the first stale round instead means the decay starts when staleness
  does), ``d = decay`` (0.96 in the paper). Before that round the threshold is infinite, i.e.
  pure asynchrony while nothing is stale. **Deviation: a floor.** ``beta_k`` never falls
  below ``threshold_floor`` (default 1), and a buffer whose mean staleness is at most the
  floor never waits: the released code's gate, ``mean <= bound`` with ``bound >= 1``, at its
  lowest bound. Without a floor ``beta_k`` decays to 0 and even a buffer of one fresh and one
  1-stale gradient waits (``docs/decisions/stellaris-threshold-floor.md``, with the
  measurements).
* **Gate**: an arriving gradient joins the buffer; the buffer is aggregated when its
  mean staleness is below ``beta_k`` (the paper's ``delta < beta_k``) or at most the floor,
  otherwise it waits for fresher gradients — but never
  longer than the learners allow: it is aggregated anyway once no learner is computing (no
  fresher gradient can come) or once it holds one gradient per allowed learner. Staleness is
  measured against the version, which only moves on aggregation, so waiting never makes a
  buffered gradient staler. Why each update was released is counted
  (``threshold/released_{below,full,idle}``), and so are the waits.
* **Staleness-scaled steps**: gradient ``j`` is weighted ``1 / delta_j^(1/v)``
  (``v = smoothness``; ``delta_j = 0`` gives 1) and the update is
  ``g_c = (1/H_c) * sum_j alpha0 / delta_j^(1/v) * g_j``, applied as ``theta -= g_c`` (alpha0
  by the parameter actor). The paper writes the step both as ``alpha_c = alpha0 /
  delta_c^(1/v)`` (a buffer's staleness) and per gradient inside the sum; the per-gradient
  reading is used, which is the same when the buffer's gradients are equally stale. The
  method's equations write the step with a square root, ``alpha0 / sqrt(delta)`` (v = 2);
  its evaluation (§7.1, §7.4, Fig. 13) names ``v`` the "LR smoothness" and runs v = 3,
  which is the default here, with v = 2 the equations' form. The released code never
  applies this scaling; here it is tested.
* **decay: auto** (new, not in the paper or its code): ``d`` adapts each round to reward
  progress. With ``R`` an exponential moving average (0.3) of the recent mean return the driver
  reports, a round in which ``R`` rose moves ``d`` a quarter of the way towards 0.999 (keep the
  asynchrony that is paying off), a round in which it did not moves it a quarter of the way
  towards 0.90 (tighten towards fresh gradients). ``d`` starts at 0.96; without reward signals
  it stays there.

Global importance-sampling truncation, the third part of the method ("Importance Sampling
Truncated Trajectory Processing"), acts in the learners (``learner.is_truncation``,
:mod:`dask_rl.staleness.truncation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dask_rl.config.schema import AggregationConfig, option
from dask_rl.staleness.base import WAIT, Arrival, Decision, Strategy


@dataclass(frozen=True, kw_only=True)
class StellarisConfig(AggregationConfig):
    strategy: Literal["stellaris"] = option("stellaris", "Stellaris: dynamic staleness "
                                                         "threshold, staleness-scaled steps")
    decay: float | Literal["auto"] = option(0.96, "threshold decay d per round "
                                                  "(beta_k = delta_max d^k), or auto",
                                            gt=0, le=1)
    smoothness: float = option(3.0, "v in the step alpha0 / delta^(1/v)", gt=0)
    threshold_floor: float = option(1.0, "the least beta_k may decay to: a buffer whose mean "
                                         "staleness is at most it never waits", ge=0)

AUTO_START, AUTO_MIN, AUTO_MAX, AUTO_RATE, REWARD_EMA = 0.96, 0.90, 0.999, 0.25, 0.3


def step_scale(staleness: int, smoothness: float) -> float:
    """``1 / delta**(1/v)``, and 1 for a fresh gradient."""
    return 1.0 if staleness <= 0 else staleness ** (-1.0 / smoothness)


class Stellaris(Strategy):
    config_class = StellarisConfig
    name = "stellaris"

    def __init__(self, cfg, *, learners: int = 1):
        super().__init__(cfg, learners=learners)
        self.auto = cfg.decay == "auto"
        self.decay = AUTO_START if self.auto else float(cfg.decay)
        self.delta_max: float | None = None
        self.decayed = math.inf  # delta_max * d^k, without the floor
        self.round_max_staleness = 0
        self.reward_ema: float | None = None
        # why each update was released, and how often the gate held gradients back
        self.released = {"below": 0, "full": 0, "idle": 0}
        self.waits = 0

    @property
    def beta(self) -> float:
        """beta_k = max(delta_max d^k, threshold_floor); infinite until a round saw a stale
        gradient."""
        return max(self.decayed, self.cfg.threshold_floor)

    def on_gradient(self, arrival: Arrival) -> list[Decision]:
        if arrival.version >= self.valid_from:  # a superseded gradient is never applied
            self.round_max_staleness = max(self.round_max_staleness, self.staleness(arrival))
        return super().on_gradient(arrival)

    def on_round_end(self, **signals: float) -> list[Decision]:
        if self.delta_max is None:
            if self.round_max_staleness > 0:
                self.delta_max = float(self.round_max_staleness)
                self.decayed = self.delta_max  # k = 0
        else:
            if self.auto:
                self._adapt(signals.get("reward"))
            self.decayed *= self.decay
        self.round_max_staleness = 0
        return super().on_round_end(**signals)

    def _adapt(self, reward: float | None) -> None:
        if reward is None or not math.isfinite(reward):
            return
        previous = self.reward_ema
        self.reward_ema = reward if previous is None else (
            REWARD_EMA * reward + (1 - REWARD_EMA) * previous)
        if previous is None:
            return
        goal = AUTO_MAX if self.reward_ema > previous else AUTO_MIN
        self.decay += AUTO_RATE * (goal - self.decay)

    def decide(self) -> Decision:
        if not self.buffer:
            return WAIT
        stale = {i: self.staleness(a) for i, a in self.buffer.items()}
        mean = sum(stale.values()) / len(stale)
        if mean < self.beta or mean <= self.cfg.threshold_floor:
            reason = "below"
        elif not self.active:
            reason = "idle"   # no learner is computing: no fresher gradient can come
        elif len(self.buffer) >= self.learners:
            reason = "full"   # one gradient per allowed learner: waiting longer is pointless
        else:
            self.waits += 1
            return WAIT  # fresher gradients are on their way
        self.released[reason] += 1
        h = len(stale)
        v = self.cfg.smoothness
        weights = {i: step_scale(d, v) / h for i, d in stale.items()}
        return self._aggregate(weights, threshold=self.beta, buffer_mean_staleness=mean,
                               lr_scale=sum(weights.values()))

    def metrics(self) -> dict:
        m = super().metrics()
        m.update({"threshold/beta": self.beta if math.isfinite(self.beta) else None,
                  "threshold/delta_max": self.delta_max, "threshold/decay": self.decay,
                  "threshold/waits": self.waits,
                  **{f"threshold/released_{k}": v for k, v in self.released.items()}})
        return m

    def _extra_state(self) -> dict:
        return {"delta_max": self.delta_max,
                "beta": self.decayed if math.isfinite(self.decayed) else None,
                "decay": self.decay, "reward_ema": self.reward_ema,
                "round_max_staleness": self.round_max_staleness, "waits": self.waits,
                "released": dict(self.released)}

    def _load_extra_state(self, state: dict) -> None:
        self.delta_max = state["delta_max"]
        self.decayed = math.inf if state["beta"] is None else float(state["beta"])
        self.waits = int(state.get("waits", 0))
        self.released = {"below": 0, "full": 0, "idle": 0, **state.get("released", {})}
        self.decay = float(state["decay"])
        self.reward_ema = state["reward_ema"]
        self.round_max_staleness = int(state["round_max_staleness"])
