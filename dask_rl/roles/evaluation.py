"""Greedy evaluation of one policy version: whole episodes, the mode of each action."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from dask_rl.algos import registry
from dask_rl.config.schema import PipelineConfig
from dask_rl.data import Evaluation, PolicySnapshot
from dask_rl.envs import make_vector_env
from dask_rl.models import load_snapshot


@torch.inference_mode()
def evaluate(cfg: PipelineConfig, snapshot: PolicySnapshot, *, episodes: int,
             seed: int) -> Evaluation:
    """Greedy evaluation: mean and spread of the returns of ``episodes`` full episodes."""
    n = min(episodes, 16)
    env = make_vector_env(cfg.env, n, seed=seed, training=False)
    model = registry.build(cfg.algo).make_model(
        env.single_observation_space, env.single_action_space, cfg.model,
        normalize_obs=cfg.env.normalize_obs)
    load_snapshot(model, snapshot)
    model.eval()
    space = env.single_action_space
    bounds = (space.low, space.high) if isinstance(space, spaces.Box) else None
    # Each env owes a fixed quota of episodes, so short episodes are not over-represented.
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    obs, returns, lengths = env.first_obs, [], []
    try:
        while quota.any():
            action, _ = model.act(torch.as_tensor(obs), greedy=True)
            action = action.numpy()
            if bounds is not None:
                action = np.clip(action, *bounds)
            obs, _, _, _, info = env.step(action)
            final = info.get("final_info")
            if final and "episode" in final:
                for i in np.flatnonzero(final["_episode"]):
                    if quota[i] > 0:
                        quota[i] -= 1
                        returns.append(float(final["episode"]["r"][i]))
                        lengths.append(int(final["episode"]["l"][i]))
    finally:
        env.close()
    return Evaluation.of(returns, lengths, version=snapshot.version)
