"""Policy and value networks, and the flat parameter vectors the parameter actor moves.

``make_model(obs_space, action_space, cfg)`` picks an MLP actor-critic for vector observations
and the Nature CNN (Mnih et al. 2015) for stacked uint8 frames; discrete action spaces get a
categorical head, boxes a Gaussian with a state-independent log standard deviation.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from dask_rl.config.schema import ModelConfig
from dask_rl.data import PolicySnapshot
from dask_rl.models.actor_critic import (
    ActorCritic,
    DeterministicPolicy,
    NatureCNNActorCritic,
)

__all__ = ["ActorCritic", "DeterministicPolicy", "NatureCNNActorCritic", "make_model",
           "make_policy", "get_flat", "set_flat",
           "num_parameters", "load_snapshot", "resolve_device", "flatten_"]


def make_model(obs_space: spaces.Space, action_space: spaces.Space, cfg: ModelConfig,
               *, normalize_obs: bool = False, seed: int | None = None) -> nn.Module:
    """Build the network for these spaces; ``seed`` makes its initial weights reproducible.

    ``normalize_obs`` adds running observation statistics (buffers, not parameters), set with
    ``model.obs_norm.set_moments``.
    """
    if not isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)):
        raise ValueError(f"unsupported action space {action_space}")
    if not isinstance(obs_space, spaces.Box):
        raise ValueError(f"unsupported observation space {obs_space}")
    gen_state = torch.random.get_rng_state()
    if seed is not None:
        torch.manual_seed(seed)
    try:
        if len(obs_space.shape) == 3 and obs_space.dtype == np.uint8:
            return NatureCNNActorCritic(obs_space, action_space)
        return ActorCritic(obs_space, action_space, cfg, normalize_obs=normalize_obs)
    finally:
        if seed is not None:
            torch.random.set_rng_state(gen_state)


def make_policy(obs_space: spaces.Space, action_space: spaces.Space, cfg: ModelConfig,
                *, normalize_obs: bool = False, seed: int | None = None) -> DeterministicPolicy:
    """The deterministic MLP policy that evolution strategies perturb."""
    gen_state = torch.random.get_rng_state()
    if seed is not None:
        torch.manual_seed(seed)
    try:
        return DeterministicPolicy(obs_space, action_space, cfg, normalize_obs=normalize_obs)
    finally:
        torch.random.set_rng_state(gen_state)


def get_flat(model: nn.Module) -> np.ndarray:
    """All trainable parameters as one float32 vector (a copy)."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).numpy().astype(
            np.float32, copy=False)


def set_flat(model: nn.Module, flat: np.ndarray) -> None:
    """Load a vector made by :func:`get_flat` into ``model`` in place."""
    vec = torch.as_tensor(flat)
    n = num_parameters(model)
    if vec.numel() != n:
        raise ValueError(f"flat vector has {vec.numel()} values, the model has {n} parameters")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            k = p.numel()
            p.copy_(vec[offset:offset + k].view_as(p))
            offset += k


def flatten_(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-home all parameters, and their gradients, in two flat buffers: ``(params, grads)``.

    Afterwards each parameter is a view into ``params`` and its ``.grad`` a view into
    ``grads`` (backward accumulates into existing gradients in place), so optimizers and
    gradient clipping work on one vector. Call it after moving the model to its device, and
    zero ``grads`` instead of setting gradients to None.
    """
    ps = list(model.parameters())
    n = sum(p.numel() for p in ps)
    flat = torch.empty(n, dtype=ps[0].dtype, device=ps[0].device)
    grads = torch.zeros_like(flat)
    offset = 0
    for p in ps:
        k = p.numel()
        flat[offset:offset + k].copy_(p.detach().reshape(-1))
        p.data = flat[offset:offset + k].view_as(p)
        p.grad = grads[offset:offset + k].view_as(p)
        offset += k
    return flat, grads


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_snapshot(model: nn.Module, snapshot: PolicySnapshot) -> None:
    """Load a parameter actor's snapshot (parameters and observation statistics)."""
    set_flat(model, snapshot.params)
    norm = getattr(model, "obs_norm", None)
    if norm is not None and snapshot.moments and "obs" in snapshot.moments:
        norm.set_moments(snapshot.moments["obs"])


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when a GPU is visible, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("learner.device is 'cuda' but no CUDA device is visible here")
    return torch.device(device)
