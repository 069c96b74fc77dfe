"""Population-based training's decision rules (Jaderberg et al., 2017), pure.

When members are *ready*, truncation selection pairs each member of the bottom ``fraction``
with a random member of the top ``fraction`` (exploit: the loser copies the winner's weights
and hyperparameters), then explore perturbs the copied hyperparameters — each is multiplied
by a random factor (0.8 or 1.2) or, with probability ``resample_probability``, drawn afresh
from its range (log-uniform when the range is positive) — and clipped to its range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Exploit:
    """``loser`` copies ``winner``'s weights and hyperparameters."""

    loser: int
    winner: int


def truncation_selection(scores: dict[int, float], fraction: float,
                         rng: np.random.Generator) -> list[Exploit]:
    """Bottom ``fraction`` of members (by score) each copy a random top-``fraction`` member."""
    order = sorted(scores, key=lambda m: (scores[m], m))
    k = max(1, int(math.floor(len(order) * fraction)))
    if 2 * k > len(order):
        return []
    bottom, top = order[:k], order[-k:]
    return [Exploit(loser=m, winner=int(top[rng.integers(len(top))])) for m in bottom]


def sample(space: dict[str, tuple[float, float]], rng: np.random.Generator) -> dict[str, float]:
    """Fresh hyperparameters from their ranges (log-uniform for positive ranges)."""
    return {k: _draw(lo, hi, rng) for k, (lo, hi) in space.items()}


def explore(hparams: dict[str, float], space: dict[str, tuple[float, float]],
            rng: np.random.Generator, *, resample_probability: float = 0.25,
            factors: tuple[float, ...] = (0.8, 1.2)) -> dict[str, float]:
    """Perturbed (or resampled) copies of ``hparams``, clipped to ``space``."""
    out = {}
    for key, value in hparams.items():
        lo, hi = space[key]
        if rng.random() < resample_probability:
            new = _draw(lo, hi, rng)
        else:
            new = value * factors[rng.integers(len(factors))]
            if value == 0:  # a multiplicative step cannot leave 0: nudge into the range
                new = lo + (hi - lo) * 0.1 * rng.random()
        out[key] = float(min(max(new, lo), hi))
    return out


def _draw(lo: float, hi: float, rng: np.random.Generator) -> float:
    if lo > 0:
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    return float(rng.uniform(lo, hi))
