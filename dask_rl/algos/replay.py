"""Learning from replayed transitions: what every replay algorithm shares, apart from any
runtime.

A replay algorithm (DQN, or SAC/TD3 registered from outside) is trained on transitions sampled
from a buffer of trajectories that stays on the workers (TianJi's replay path). The runtime
asks it, through :class:`ReplayAlgorithm`, only:

* :meth:`~ReplayAlgorithm.sample` — the transitions at given rows of a trajectory (run on the
  worker that holds it: only the sampled rows move);
* :meth:`~ReplayAlgorithm.loss` — a loss on a batch of them, against the target network;
* :meth:`~ReplayAlgorithm.exploration` and :meth:`~ReplayAlgorithm.act` — how rollouts act;
* its :class:`ReplayConfig` — the buffer, batch and ratio the runtime's controller uses.

The default :meth:`~ReplayAlgorithm.sample` cuts n-step transitions (Rainbow: Hessel et al.,
AAAI 2018, Sec. "Multi-step learning"),

    G_t^(n) = sum_{k=0}^{m-1} gamma^k R_{t+k+1} + gamma^m V(S_{t+m}),

with ``m = min(n, steps to the episode's end, steps to the trajectory's end)``: the sum stops
at an episode's end, and the bootstrap is 0 after a termination, the value of the final
observation after a truncation (time limits are not terminal: Pardo et al., ICML 2018, "Time
Limits in Reinforcement Learning"), and the value of the next
observation where the trajectory or the ``n`` steps end. A transition carries
``(obs, action, R, gamma^m or 0, next_obs)``; what ``V`` is (DQN's double-Q, SAC's soft value)
is the algorithm's loss. ``n = 1`` is the one-step transition
``(s, a, r, gamma (1 - terminated), s')``. Cutting the sum at an episode's end is Rainbow's
per-step discount ``gamma_t = 0`` at terminals.

Deviation: the sum is also cut where a rollout's trajectory ends (``m < n`` for its last
``n - 1`` steps, bootstrapping with ``gamma^m`` from the last observation: still a valid n-step
target, not Rainbow's fixed ``n``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from dask_rl.algos.base import Algorithm
from dask_rl.config.schema import AlgoConfig, option

if TYPE_CHECKING:
    from dask_rl.data import Trajectory


@dataclass(frozen=True, kw_only=True)
class ReplayConfig(AlgoConfig):
    """The ``algo`` options every replay algorithm has: the return, the target network, and
    the buffer and batches that TianJi's sample-staleness controller moves."""

    gamma: float = option(0.99, "discount", ge=0, le=1)
    n_step: int = option(3, "steps of the multi-step return", ge=1)
    target_every: int = option(100, "parameter-actor versions between target-network "
                                    "refreshes (a version is one learner task's "
                                    "updates_per_task gradient steps)", ge=1)
    batch_size: int = option(128, "B_s: transitions per gradient step (the controller may "
                                  "shrink it)", ge=1)
    min_batch_size: int = option(32, "the smallest batch the controller shrinks to", ge=1)
    updates_per_task: int = option(32, "gradient steps per learner task", ge=1)
    replay_ratio: float = option(8.0, "a floor on transitions learned per env step collected: "
                                      "rollouts wait while the learners are further behind",
                                 gt=0)
    buffer_size: int = option(50_000, "N_s: transitions the replay buffer keeps (the "
                                      "controller may grow it)", ge=1)
    max_buffer_size: int = option(200_000, "the largest buffer the controller grows to", ge=1)
    learning_starts: int = option(2_000, "transitions collected before learners start", ge=1)
    staleness_tolerance: float = option(0.2, "TianJi's bound on P = B_s / N_s", gt=0, le=1)
    staleness_lambda: float = option(1.0, "lambda of the learning rate alpha / (1 + lambda P)",
                                     ge=0)


@dataclass
class Transitions:
    """Sampled n-step transitions: the target of row ``j`` is
    ``returns[j] + discounts[j] * V(next_obs[j])``."""

    obs: np.ndarray        # [B, *obs_shape]
    actions: np.ndarray    # [B, *action_shape]
    returns: np.ndarray    # [B] float32, the discounted n-step reward sums
    discounts: np.ndarray  # [B] float32, gamma^m, 0 after a termination
    next_obs: np.ndarray   # [B, *obs_shape], the observation that bootstraps

    FIELDS: ClassVar[tuple[str, ...]] = ("obs", "actions", "returns", "discounts", "next_obs")

    def __len__(self) -> int:
        return int(self.returns.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in self.FIELDS)

    @classmethod
    def concat(cls, parts: "list[Transitions]") -> "Transitions":
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.FIELDS))


class ReplayAlgorithm(Algorithm):
    """A learner on replayed transitions: see the module doc."""
    config_class: ClassVar[type[ReplayConfig]]
    cfg: ReplayConfig

    def sample(self, traj: "Trajectory", t: np.ndarray, i: np.ndarray, *,
               rewards: np.ndarray | None = None) -> Transitions:
        """The transitions starting at steps ``(t[j], i[j])`` of ``traj``; ``rewards``
        replaces its raw rewards (clipped as the learners see them). n-step by default."""
        return sample_transitions(traj, t, i, gamma=self.cfg.gamma, n=self.cfg.n_step,
                                  rewards=rewards)

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, target: torch.nn.Module, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, stats)`` on a batch of transitions (the fields of :class:`Transitions`,
        as tensors); ``target`` holds the target network's parameters."""

    @abc.abstractmethod
    def exploration(self, env_steps: int) -> float:
        """How much rollouts explore after ``env_steps`` environment steps (DQN: epsilon);
        fixed for a rollout, passed to :meth:`act`."""

    @abc.abstractmethod
    def act(self, model: torch.nn.Module, obs: torch.Tensor, exploration: float, *,
            rng: np.random.Generator, generator: torch.Generator) -> np.ndarray:
        """A rollout's actions for a batch of observations."""

    def validate(self, env: Any) -> str | None:
        """Why this algorithm cannot run with these pipeline settings (one line), or None;
        ``env`` is the pipeline's ``EnvConfig``."""
        for key in ("normalize_obs", "normalize_reward"):
            if getattr(env, key):
                return (f"env.{key}: not supported with algo.name {self.name!r} (its learners "
                        f"sample transitions and see no running statistics)")
        cfg = self.cfg
        if cfg.learning_starts > cfg.buffer_size:
            return (f"algo.learning_starts: must be <= algo.buffer_size ({cfg.buffer_size}), "
                    f"got {cfg.learning_starts}")
        if cfg.min_batch_size > cfg.batch_size:
            return (f"algo.min_batch_size: must be <= algo.batch_size ({cfg.batch_size}), got "
                    f"{cfg.min_batch_size}")
        if cfg.max_buffer_size < cfg.buffer_size:
            return (f"algo.max_buffer_size: must be >= algo.buffer_size ({cfg.buffer_size}), "
                    f"got {cfg.max_buffer_size}")
        return None


def n_step_returns(rewards: np.ndarray, terminated: np.ndarray, episode_end: np.ndarray,
                   gamma: float, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each step's n-step return, split for sampling: ``(R, discount, last)``, all ``[T, N]``.

    ``R[t] = sum_{k<m} gamma^k r_{t+k}``; ``discount[t] = gamma^m``, or 0 where the sum ended
    in a termination; ``last[t] = t + m - 1``, the step whose *next* observation bootstraps
    (the target is ``R + discount * V(next obs of step last)``).

    ``rewards[t]`` is the reward of the step from ``s_t``; ``terminated[t]`` says that step
    ended the episode in a terminal state, ``episode_end[t]`` that it ended it at all
    (terminated or truncated).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    T = rewards.shape[0]
    rewards = rewards.astype(np.float64)
    returns = np.zeros(rewards.shape, np.float64)
    discounts = np.zeros(rewards.shape, np.float64)
    last = np.zeros(rewards.shape, np.int64)
    # For each start t, walk k = 0.. while the sum goes on; ``open_`` marks the starts whose
    # sum has not stopped yet, ``scale`` is gamma^k for them.
    open_ = np.ones(rewards.shape, bool)
    scale = np.ones(rewards.shape, np.float64)
    for k in range(n):
        step = np.arange(T) + k                      # the step each start has reached
        at = np.minimum(step, T - 1)
        live = open_ & (step < T)[:, None]
        returns += np.where(live, scale * rewards[at], 0.0)
        stop = live & ((k == n - 1) | (step == T - 1)[:, None] | episode_end[at])
        discounts = np.where(stop, np.where(terminated[at], 0.0, scale * gamma), discounts)
        last = np.where(stop, at[:, None], last)
        open_ &= ~stop
        scale = scale * gamma
    return returns.astype(np.float32), discounts.astype(np.float32), last


def n_step_targets(rewards: np.ndarray, terminated: np.ndarray, episode_end: np.ndarray,
                   bootstrap: np.ndarray, gamma: float, n: int) -> np.ndarray:
    """The n-step targets ``G_t`` of every step, ``[T, N]``, given ``bootstrap[t]``, the value
    of the observation after step ``t`` (the final observation where the episode was
    truncated; ignored where it terminated)."""
    returns, discounts, last = n_step_returns(rewards, terminated, episode_end, gamma, n)
    boot = np.take_along_axis(bootstrap, last, axis=0)
    return (returns + discounts * boot).astype(np.float32)


def next_observations(traj: "Trajectory", t: np.ndarray, i: np.ndarray) -> np.ndarray:
    """The observation after step ``t`` of env ``i`` (row-wise): the final observation where
    the episode was truncated there (``obs[t + 1]`` is the next episode's first, after an
    autoreset), ``last_obs`` after the trajectory's last step, else ``obs[t + 1]``."""
    T = traj.num_steps
    out = traj.obs[np.minimum(t + 1, T - 1), i].copy()
    at_end = t == T - 1
    out[at_end] = traj.last_obs[i[at_end]]
    if len(traj.trunc_index):
        where = {(int(a), int(b)): k for k, (a, b) in enumerate(traj.trunc_index)}
        for row, key in enumerate(zip(t.tolist(), i.tolist())):
            if key in where:
                out[row] = traj.trunc_obs[where[key]]
    return out


def sample_transitions(traj: "Trajectory", t: np.ndarray, i: np.ndarray, *, gamma: float,
                       n: int, rewards: np.ndarray | None = None) -> Transitions:
    """The n-step transitions starting at steps ``(t[j], i[j])`` of a trajectory; ``rewards``
    replaces the raw ones (clipped or scaled as the learner sees them)."""
    episode_end = traj.terminated | traj.truncated
    returns, discounts, last = n_step_returns(
        traj.rewards if rewards is None else rewards, traj.terminated, episode_end, gamma, n)
    return Transitions(obs=traj.obs[t, i], actions=traj.actions[t, i],
                       returns=returns[t, i], discounts=discounts[t, i],
                       next_obs=next_observations(traj, last[t, i], i))
