"""Stellaris' global importance-sampling truncation: a per-sample weight learners apply.

Yu et al., SC'24, "Importance Sampling Truncated Trajectory Processing": each sample's
importance weight is

    R' = min(|min_i pi_theta_i(a|s) / mu(a|s)|, rho)

over all active learners' current policies, this learner's own ratio ``r`` included,
detached. The learner measures the other learners' policies against the same denominator as
the algorithm's ratio (the behaviour policy for PPO; IMPACT's ``D``, see
:attr:`~dask_rl.algos.base.Batch.ratio_logp`, so that ``R'`` caps the ratio IMPACT's surrogate
actually uses) and keeps their minimum in ``Batch.cross_ratio_min``; an algorithm calls the
weight function with its own ratio inside its loss (:class:`~dask_rl.algos.base.SampleWeights`)
and knows nothing else of the method. Decision record: ``docs/decisions/truncation-weight.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dask_rl.algos.base import Batch


def truncation_weight(ratio: torch.Tensor, cross_ratio_min: torch.Tensor,
                      rho: float) -> torch.Tensor:
    """``R' = min(|min(r, min_i r_i)|, rho)``, detached: ``cross_ratio_min`` is the minimum
    over the *other* learners' ratios ``r_i``."""
    return torch.clamp(torch.min(ratio, cross_ratio_min).abs(), max=rho).detach()


class GlobalTruncation:
    """The weight function a learner with ``learner.is_truncation`` hands its algorithm's loss:
    ``(ratio, minibatch) -> R'``. Where no other learner was active the minimum is over this
    learner's own policy alone: ``R' = min(|r|, rho)``."""

    def __init__(self, rho: float):
        self.rho = rho

    def __call__(self, ratio: torch.Tensor, mb: "Batch") -> torch.Tensor:
        others = mb.cross_ratio_min if mb.cross_ratio_min is not None else ratio
        return truncation_weight(ratio, others, self.rho)
