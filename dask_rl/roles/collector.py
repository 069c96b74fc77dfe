"""Collecting trajectories: a persistent vector env stepped by a local copy of the policy.

A :class:`Collector` is the single-process building block of a rollout task: it keeps its
environments (and their unfinished episodes) between calls, so episodes continue across tasks,
and batches policy inference over the vector env. One collector serves one rollout slot.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from gymnasium import spaces

from dask_rl.algos import registry
from dask_rl.config.schema import PipelineConfig
from dask_rl.data import PolicySnapshot, Trajectory
from dask_rl.envs import episode_stats, make_vector_env
from dask_rl.models import load_snapshot
from dask_rl.models.normalizer import batch_moments


class Collector:
    """Steps ``cfg.env.num_envs`` environments with the policy version last loaded.

    With ``env.normalize_reward`` the collector tracks each env's discounted return, at the
    algorithm's declared discount (:attr:`~dask_rl.algos.base.Needs.discount`), whose running
    standard deviation the learners scale rewards by.

    Examples
    --------
    >>> collector = Collector(cfg, seed=0)
    >>> collector.load(snapshot)
    >>> traj = collector.collect(128)
    """

    def __init__(self, cfg: PipelineConfig, *, seed: int, slot: int = 0):
        self.cfg = cfg
        self.slot = slot
        self.algorithm = registry.build(cfg.algo)
        self.discount = self.algorithm.needs.discount if cfg.env.normalize_reward else None
        if cfg.env.normalize_reward and self.discount is None:
            raise ValueError(f"env.normalize_reward: algorithm {cfg.algo.name!r} declares no "
                             f"discount to scale rewards by")
        self.env = make_vector_env(cfg.env, seed=seed)
        self.obs = self.env.first_obs
        self.model = self.algorithm.make_model(self.env.single_observation_space,
                                               self.env.single_action_space, cfg.model,
                                               normalize_obs=cfg.env.normalize_obs)
        self.model.eval()
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)   # a replay algorithm's exploration draws
        self.version = -1
        self.source: str | None = None  # which parameter actor the version came from
        self.rollouts_since_pull = 0    # the event-triggered pull's counter (rollout_task)
        self.discounted = np.zeros(self.env.num_envs)  # running returns, for reward scaling
        space = self.env.single_action_space
        self._bounds = (space.low, space.high) if isinstance(space, spaces.Box) else None

    def load(self, snapshot: PolicySnapshot, source: str | None = None) -> None:
        load_snapshot(self.model, snapshot)
        self.version = snapshot.version
        self.source = source

    @torch.inference_mode()
    def collect(self, num_steps: int, *, exploration: float | None = None) -> Trajectory:
        """Step all environments ``num_steps`` times and return what happened.

        With ``exploration`` the replay algorithm acts
        (:meth:`~dask_rl.algos.replay.ReplayAlgorithm.act`, e.g. DQN's epsilon-greedy) instead
        of a sample of the policy; ``behaviour_logp`` is then 0."""
        t0 = time.perf_counter()
        T, N = num_steps, self.env.num_envs
        obs_space, act_space = self.env.single_observation_space, self.env.single_action_space
        obs_buf = np.empty((T, N, *obs_space.shape), obs_space.dtype)
        act_buf = np.empty((T, N, *act_space.shape), act_space.dtype if self._bounds is None
                           else np.float32)
        rewards = np.empty((T, N), np.float32)
        terminated = np.empty((T, N), bool)
        truncated = np.empty((T, N), bool)
        logp = np.empty((T, N), np.float32)
        trunc_index, trunc_obs, returns, lengths = [], [], [], []
        scale_rewards = self.cfg.env.normalize_reward
        discounted = np.empty((T, N)) if scale_rewards else None
        for t in range(T):
            obs_buf[t] = self.obs
            if exploration is None:
                action, log_prob = self.model.act(torch.as_tensor(self.obs),
                                                  generator=self.generator)
                action = action.numpy()
                logp[t] = log_prob.numpy()
            else:
                action = self.algorithm.act(self.model, torch.as_tensor(self.obs), exploration,
                                            rng=self.rng, generator=self.generator)
                logp[t] = 0.0
            act_buf[t] = action
            env_action = action if self._bounds is None else np.clip(action, *self._bounds)
            self.obs, rewards[t], terminated[t], truncated[t], info = self.env.step(env_action)
            if scale_rewards:
                self.discounted = self.discounted * self.discount + rewards[t]
                discounted[t] = self.discounted
                self.discounted[terminated[t] | truncated[t]] = 0.0
            cut = truncated[t] & ~terminated[t]
            if cut.any():
                for n in np.flatnonzero(cut):
                    trunc_index.append((t, n))
                    trunc_obs.append(info["final_obs"][n])
            r, length = episode_stats(info)
            if len(r):
                returns.append(r)
                lengths.append(length)
        return Trajectory(
            obs=obs_buf, actions=act_buf, rewards=rewards, terminated=terminated,
            truncated=truncated, behaviour_logp=logp, last_obs=self.obs.copy(),
            trunc_index=np.asarray(trunc_index, np.int32).reshape(-1, 2),
            trunc_obs=np.asarray(trunc_obs, obs_space.dtype).reshape(-1, *obs_space.shape),
            policy_version=self.version,
            episode_returns=np.concatenate(returns) if returns else np.zeros(0),
            episode_lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
            slot=self.slot,
            moments=self._moments(obs_buf, discounted),
            collect_s=time.perf_counter() - t0,
        )

    def _moments(self, obs: np.ndarray, discounted: np.ndarray | None) -> dict | None:
        moments = {}
        if self.cfg.env.normalize_obs:
            moments["obs"] = batch_moments(obs.reshape(obs.shape[0] * obs.shape[1], -1))
        if discounted is not None:
            moments["return"] = batch_moments(discounted.reshape(-1, 1))
        return moments or None

    def close(self) -> None:
        self.env.close()
