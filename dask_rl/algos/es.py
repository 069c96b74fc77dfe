"""OpenAI evolution strategies (Salimans, Ho, Chen, Sidor & Sutskever, 2017), ask / tell.

A generation perturbs the mean parameters ``theta`` with antithetic pairs
``theta +- sigma * eps_i``, where every ``eps_i`` is a slice of a shared Gaussian *noise table*
built deterministically from a seed wherever it is needed — so a perturbation travels as one
integer (its offset in the table), never as a vector. Returns are shaped by centered ranks over
all ``2N`` evaluations, and the gradient estimate

    g = sum_i (s_i+ - s_i-) eps_i / (2N)

is ascended with Adam (step size ``algo.step_size``) after weight decay: the optimizer
descends ``-g + l2 * theta``.

Everything here is pure: explicit state, explicit ``numpy.random.Generator``.

Examples
--------
>>> table = noise_table(seed=0, size=1_000_000)
>>> idx = ask(rng, table_size=len(table), dim=dim, pairs=32)
>>> returns = evaluate(theta, idx)            # [32, 2]: (plus, minus) per pair
>>> g = gradient(returns, idx, table, dim)    # then Adam descends -g + l2 * theta
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dask_rl.algos.base import EvolutionAlgorithm
from dask_rl.config.schema import AlgoConfig, ModelConfig, option


@dataclass(frozen=True, kw_only=True)
class ESConfig(AlgoConfig):
    name: Literal["es"] = option("es", "algorithm")
    sigma: float = option(0.02, "standard deviation of the parameter perturbations", gt=0)
    step_size: float = option(0.01, "Adam step size (alpha) on the mean parameters", gt=0)
    l2: float = option(0.005, "weight decay coefficient", ge=0)
    pairs: int = option(32, "antithetic pairs per generation (population 2N)", ge=1)
    pairs_per_task: int = option(4, "pairs one task evaluates (make tasks last >= ~0.2 s)",
                                 ge=1)
    episodes: int = option(1, "episodes per perturbation", ge=1)
    noise_table_size: int = option(10_000_000, "float32 entries of the shared noise table "
                                               "(built on every worker)", ge=1)
    noise_seed: int = option(123, "seed of the noise table", ge=0)
    max_episode_steps: int | None = option(None, "cut evaluation episodes at this length", ge=1)
    eval_every: int = option(5, "noiseless evaluation every N generations", ge=1)
    renamed = {"lr": "step_size"}


class ES(EvolutionAlgorithm):
    """OpenAI-ES (Salimans et al. 2017, Algorithm 2 with antithetic pairs and fitness
    shaping, Sec. 2.1-2.2), trained in generations by the ES driver with the functions below."""

    name = "es"
    config_class = ESConfig

    def make_model(self, obs_space: Any, action_space: Any, model_cfg: ModelConfig, *,
                   normalize_obs: bool = False, seed: int | None = None) -> torch.nn.Module:
        """The deterministic MLP policy the perturbations move."""
        from dask_rl.models import make_policy

        return make_policy(obs_space, action_space, model_cfg, normalize_obs=normalize_obs,
                           seed=seed)


def noise_table(seed: int, size: int) -> np.ndarray:
    """``size`` standard normal float32 values, the same on every machine for a seed."""
    return np.random.default_rng(seed).standard_normal(size, dtype=np.float32)


def ask(rng: np.random.Generator, *, table_size: int, dim: int, pairs: int) -> np.ndarray:
    """Offsets of ``pairs`` perturbations: ``eps_i = table[idx_i : idx_i + dim]``."""
    if dim > table_size:
        raise ValueError(f"the noise table ({table_size}) is smaller than the policy ({dim})")
    return rng.integers(0, table_size - dim + 1, size=pairs, dtype=np.int64)


def perturbation(table: np.ndarray, index: int, dim: int) -> np.ndarray:
    return table[index:index + dim]


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5] (ties broken by position), any shape."""
    flat = x.ravel()
    ranks = np.empty(flat.size, dtype=np.float64)
    ranks[flat.argsort(kind="stable")] = np.arange(flat.size)
    if flat.size > 1:
        ranks = ranks / (flat.size - 1) - 0.5
    else:
        ranks[:] = 0.0
    return ranks.reshape(x.shape)


def weights(returns: np.ndarray) -> np.ndarray:
    """Per-pair weights ``(s+ - s-) / (2N)`` from raw returns ``[N, 2]``."""
    shaped = centered_ranks(np.asarray(returns, np.float64))
    return (shaped[:, 0] - shaped[:, 1]) / returns.size


def gradient(returns: np.ndarray, indices: np.ndarray, table: np.ndarray,
             dim: int) -> np.ndarray:
    """The ES gradient estimate (ascent direction) from ``[N, 2]`` returns."""
    return weighted_noise(weights(returns), indices, table, dim)


def weighted_noise(w: np.ndarray, indices: np.ndarray, table: np.ndarray,
                   dim: int) -> np.ndarray:
    """``sum_i w_i eps_i``, computed where the noise table lives."""
    g = np.zeros(dim, np.float64)
    for wi, idx in zip(w, indices):
        g += wi * perturbation(table, int(idx), dim)
    return g.astype(np.float32)


def descent_direction(g: np.ndarray, theta: np.ndarray, l2: float) -> np.ndarray:
    """What the optimizer descends: ``-g + l2 * theta`` (ascent on g, weight decay)."""
    return (-g + l2 * theta).astype(np.float32)
