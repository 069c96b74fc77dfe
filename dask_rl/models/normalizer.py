"""Running observation statistics (Chan et al.'s parallel merge of moments).

Moments are one float64 vector ``[count, mean..., M2...]`` so that they travel with the flat
parameters through the parameter actor and into checkpoints; rollout tasks measure the moments
of the observations they saw and the actor merges them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CLIP = 10.0
EPS = 1e-8


def empty_moments(dim: int) -> np.ndarray:
    return np.zeros(1 + 2 * dim, np.float64)


def batch_moments(x: np.ndarray) -> np.ndarray:
    """Moments of a batch ``[B, D]`` (any leading shape is flattened)."""
    x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    mean = x.mean(0)
    m2 = ((x - mean) ** 2).sum(0)
    return np.concatenate([[len(x)], mean, m2])


def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Moments of the union of two samples."""
    d = (len(a) - 1) // 2
    na, nb = a[0], b[0]
    if nb == 0:
        return a.copy()
    if na == 0:
        return b.copy()
    n = na + nb
    ma, mb = a[1:1 + d], b[1:1 + d]
    delta = mb - ma
    mean = ma + delta * nb / n
    m2 = a[1 + d:] + b[1 + d:] + delta ** 2 * na * nb / n
    return np.concatenate([[n], mean, m2])


def mean_var(moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = (len(moments) - 1) // 2
    n = moments[0]
    if n < 2:
        return np.zeros(d), np.ones(d)
    return moments[1:1 + d], moments[1 + d:] / n


class ObsNormalizer(nn.Module):
    """``clip((obs - mean) / sqrt(var + eps), -10, 10)`` with statistics set from moments."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))

    def set_moments(self, moments: np.ndarray) -> None:
        mean, var = mean_var(moments)
        self.mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.var.copy_(torch.as_tensor(var, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.clamp((obs - self.mean) / torch.sqrt(self.var + EPS), -CLIP, CLIP)
