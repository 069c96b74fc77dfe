"""What a rollout task collects: a :class:`Trajectory` of numpy arrays.

Trajectories are numpy arrays (time-major ``[T, N, ...]``) so that Dask sizes them exactly,
moves them worker to worker without pickling overhead, and any learner can read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Trajectory:
    """``T`` steps of ``N`` environments collected by one rollout task.

    With same-step autoreset, ``obs[t + 1]`` after a finished episode is the next episode's
    first observation; the final observations of *truncated* episodes (needed to bootstrap
    their value) are kept sparsely in ``trunc_index`` / ``trunc_obs``.
    """

    obs: np.ndarray             # [T, N, *obs_shape]
    actions: np.ndarray         # [T, N, *action_shape]
    rewards: np.ndarray         # [T, N] float32, raw (unclipped) env rewards
    terminated: np.ndarray      # [T, N] bool
    truncated: np.ndarray       # [T, N] bool
    behaviour_logp: np.ndarray  # [T, N] float32, log mu(a|s) of the acting policy
    last_obs: np.ndarray        # [N, *obs_shape], observation after the last step
    trunc_index: np.ndarray     # [K, 2] int32, (t, n) of truncated steps
    trunc_obs: np.ndarray       # [K, *obs_shape], their final observations
    policy_version: int         # parameter version the acting policy had
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    episode_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slot: int = 0                          # the rollout slot that collected it
    moments: dict | None = None            # running statistics seen: {"obs": ..., "return": ...}
    collect_s: float = 0.0                 # seconds the rollout took
    pull_s: float = 0.0                    # seconds its task spent before: state, policy pull
    slot_wait_s: float = 0.0               # seconds its task waited for the slot's envs

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def env_steps(self) -> int:
        return self.num_steps * self.num_envs

    @property
    def nbytes(self) -> int:
        arrays = [v for v in self.__dict__.values() if isinstance(v, np.ndarray)]
        return sum(a.nbytes for a in arrays) + sum(m.nbytes for m in (self.moments or {}).values())

    def __sizeof__(self) -> int:  # what dask.sizeof reports
        return self.nbytes + 256
