"""Evaluating perturbed policies: the single-process building block of ES tasks.

An :class:`ESEvaluator` holds one environment, the deterministic policy network, the mean
parameters of the generation it last saw (cached by version) and a reference to the shared
noise table; it plays whole episodes with ``theta + sigma * eps`` and ``theta - sigma * eps``
and reports only returns, lengths and observation statistics — scalars, never vectors.
"""

from __future__ import annotations

import numpy as np
import torch

from dask_rl.algos import es
from dask_rl.config.schema import PipelineConfig
from dask_rl.data import Evaluation, PerturbationResult, PolicySnapshot
from dask_rl.envs import env_spaces, make_env
from dask_rl.models import make_policy, set_flat
from dask_rl.models.normalizer import batch_moments, empty_moments, merge_moments


class ESEvaluator:
    def __init__(self, cfg: PipelineConfig, table: np.ndarray):
        self.cfg = cfg
        self.table = table
        self.env = make_env(cfg.env)
        obs_space, action_space = env_spaces(cfg.env)
        self.policy = make_policy(obs_space, action_space, cfg.model,
                                  normalize_obs=cfg.env.normalize_obs)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.snapshot: PolicySnapshot | None = None
        self.source: str | None = None

    @property
    def version(self) -> int:
        return -1 if self.snapshot is None else self.snapshot.version

    def load(self, snapshot: PolicySnapshot, source: str | None = None) -> None:
        self.snapshot = snapshot
        self.source = source
        if self.policy.obs_norm is not None and snapshot.moments:
            self.policy.obs_norm.set_moments(snapshot.moments["obs"])

    def episode(self, theta: np.ndarray, seed: int,
                record: list[np.ndarray] | None = None) -> tuple[float, int]:
        """One episode's return and length with parameters ``theta``."""
        set_flat(self.policy, theta)
        obs, _ = self.env.reset(seed=seed)
        total, steps, limit = 0.0, 0, self.cfg.algo.max_episode_steps
        while True:
            if record is not None:
                record.append(np.asarray(obs, np.float64).reshape(-1))
            action = self.policy(torch.as_tensor(obs).unsqueeze(0))[0].numpy()
            obs, reward, terminated, truncated, _ = self.env.step(action)
            total += float(reward)
            steps += 1
            if terminated or truncated or (limit is not None and steps >= limit):
                return total, steps

    def evaluate(self, indices: np.ndarray, seeds: np.ndarray) -> PerturbationResult:
        """Returns and lengths ``[n, 2]`` (plus, minus) of each pair, and observation moments."""
        cfg = self.cfg.algo
        theta = self.snapshot.params
        dim = len(theta)
        returns = np.zeros((len(indices), 2))
        lengths = np.zeros((len(indices), 2), np.int64)
        moments = empty_moments(self.obs_dim) if self.policy.obs_norm is not None else None
        for i, (idx, seed) in enumerate(zip(indices, seeds)):
            eps = es.perturbation(self.table, int(idx), dim)
            for j, sign in enumerate((1.0, -1.0)):
                record = [] if moments is not None else None
                for k in range(cfg.episodes):
                    r, n = self.episode(theta + np.float32(sign * cfg.sigma) * eps,
                                        int(seed) + k, record)
                    returns[i, j] += r / cfg.episodes
                    lengths[i, j] += n
                if record:
                    moments = merge_moments(moments, batch_moments(np.stack(record)))
        return PerturbationResult(returns=returns, lengths=lengths, moments=moments)

    def noiseless(self, episodes: int, seed: int) -> Evaluation:
        """Returns of the unperturbed mean parameters (the ES "greedy" evaluation)."""
        results = [self.episode(self.snapshot.params, seed + k) for k in range(episodes)]
        lengths = [n for _, n in results]
        return Evaluation.of([r for r, _ in results], lengths, version=self.version,
                             env_steps=int(sum(lengths)))
