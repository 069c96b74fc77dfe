"""Double DQN with n-step returns: the math, time-major ``[T, N]``, apart from any runtime.

Double Q-learning's target (van Hasselt, Guez and Silver, AAAI 2016, Eq. 4): the online
network picks the next action, the target network values it,

    Y_t = R_{t+1} + gamma Q(S_{t+1}, argmax_a Q(S_{t+1}, a; theta_t); theta^-_t),

extended to ``n`` steps as in Rainbow (Hessel et al., AAAI 2018, Sec. "Multi-step learning"):

    G_t^(n) = sum_{k=0}^{m-1} gamma^k R_{t+k+1} + gamma^m Q_double(S_{t+m}),

where ``m = min(n, steps to the episode's end, steps to the trajectory's end)``: the sum stops
at an episode's end, and its bootstrap is 0 after a termination, the double-Q value of the
final observation after a truncation (time limits are not terminal), and the double-Q value of
the next observation where the trajectory (or the ``n`` steps) end. The loss is the Huber loss
of ``Q(S_t, A_t; theta) - G_t`` (DQN's clipping of the error to [-1, 1]: Mnih et al., Nature
2015, Methods, "Training algorithm").

Exploration is epsilon-greedy with epsilon decayed linearly (Mnih et al. 2015: 1 to 0.1 over
the first million frames; the end point and length are configurable, and the default end is
0.05, as in the Rainbow-era baselines, not Nature's 0.1). Epsilon is fixed per rollout: a
rollout acts with the value for the env steps collected when it was submitted, so the schedule
is a staircase with steps of ``rollout.steps x env.num_envs``.

Deviations: the n-step sum is also cut where a rollout's trajectory ends (``m < n`` for its
last ``n - 1`` steps, bootstrapping with ``gamma^m`` from the last observation: still a
valid n-step target, not Rainbow's fixed ``n``). Learners are asynchronous tasks (TianJi's relaxed
dependencies): each pulls the parameters and the target network, takes ``updates_per_task``
Adam steps on batches of ``batch_size`` sampled transitions and pushes the change, as PPO's
learners do; the target network is refreshed by the parameter actor every ``target_every``
updates (with ``aggregation.strategy: async``, the only one DQN accepts, a version is one
learner task). The optimizer is Adam (as in Rainbow), not Nature's RMSProp. Its Q-network is
the policy head of the actor-critic models (the value head is unused): the greedy policy is
the argmax of ``Q``. TianJi's notes also keep "shadow parameters", a delayed copy for acting
decisions; they are not built: rollouts act with the parameters they last pulled (which
``rollout.pull_every``/``pull_min_versions`` can already delay), and the target network is
the delayed copy the learners use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F

from dask_rl.algos.base import Needs, ReplayAlgorithm
from dask_rl.config.schema import AlgoConfig, option

if TYPE_CHECKING:
    from dask_rl.data import Trajectory


@dataclass(frozen=True, kw_only=True)
class DQNConfig(AlgoConfig):
    name: Literal["dqn"] = option("dqn", "algorithm")
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
    eps_start: float = option(1.0, "epsilon-greedy's epsilon at the start", ge=0, le=1)
    eps_end: float = option(0.05, "... at the end of the decay", ge=0, le=1)
    eps_decay_steps: int = option(20_000, "env steps of the linear decay", ge=0)


class DQN(ReplayAlgorithm):
    """Double DQN with n-step returns: the Huber loss of ``Q(s, a) - G^(n)`` with the double-Q
    bootstrap (van Hasselt et al. 2016, Eq. 4; Hessel et al. 2018, multi-step learning)."""

    name = "dqn"
    config_class = DQNConfig
    cfg: DQNConfig

    @property
    def needs(self) -> Needs:
        return Needs(target_network_every=self.cfg.target_every, discount=self.cfg.gamma)

    def loss(self, model: torch.nn.Module, target: torch.nn.Module, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            q_next_online = model.q_values(batch["next_obs"])
            q_next_target = target.q_values(batch["next_obs"])
            best = q_next_online.argmax(-1, keepdim=True)
            boot = q_next_target.gather(1, best).squeeze(1)
            # where a sum ended in a termination the bootstrap is the reset observation's Q,
            # multiplied by 0: dropped outright, so a non-finite Q there cannot make a NaN
            targets = torch.where(batch["discounts"] > 0,
                                  batch["returns"] + batch["discounts"] * boot, batch["returns"])
        q = q_taken(model.q_values(batch["obs"]), batch["actions"])
        loss = td_loss(q, targets)
        return loss, {"losses/td_loss": float(loss.detach()),
                      "losses/q_values": float(q.detach().mean())}

    def epsilon(self, env_steps: int) -> float:
        return epsilon(env_steps, start=self.cfg.eps_start, end=self.cfg.eps_end,
                       decay_steps=self.cfg.eps_decay_steps)


@dataclass
class Transitions:
    """Sampled n-step transitions: the target of row ``j`` is
    ``returns[j] + discounts[j] * Q_double(next_obs[j])``."""

    obs: np.ndarray        # [B, *obs_shape]
    actions: np.ndarray    # [B, *action_shape]
    returns: np.ndarray    # [B] float32, the discounted n-step reward sums
    discounts: np.ndarray  # [B] float32, gamma^m, 0 after a termination
    next_obs: np.ndarray   # [B, *obs_shape], the observation that bootstraps

    def __len__(self) -> int:
        return int(self.returns.shape[0])

    @classmethod
    def concat(cls, parts: "list[Transitions]") -> "Transitions":
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("obs", "actions", "returns", "discounts", "next_obs")))


def n_step_returns(rewards: np.ndarray, terminated: np.ndarray, episode_end: np.ndarray,
                   gamma: float, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each step's n-step return, split for sampling: ``(R, discount, last)``, all ``[T, N]``.

    ``R[t] = sum_{k<m} gamma^k r_{t+k}``; ``discount[t] = gamma^m``, or 0 where the sum ended
    in a termination; ``last[t] = t + m - 1``, the step whose *next* observation bootstraps
    (the target is ``R + discount * Q_double(next obs of step last)``).

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
    """The n-step double-Q targets ``G_t`` of every step, ``[T, N]``, given ``bootstrap[t]``,
    the double-Q value of the observation after step ``t`` (the final observation where the
    episode was truncated; ignored where it terminated)."""
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


def td_loss(q_taken: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Huber loss (delta = 1) of ``Q(s, a) - G``, averaged over the batch."""
    return F.smooth_l1_loss(q_taken, targets, beta=1.0)


def q_taken(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``Q(s_i, a_i)`` of each row: ``q`` is ``[B, A]``, ``actions`` ``[B]`` integers."""
    return q.gather(1, actions.long().unsqueeze(1)).squeeze(1)


def epsilon(env_steps: int, *, start: float, end: float, decay_steps: int) -> float:
    """Epsilon-greedy's epsilon after ``env_steps`` steps: linear from ``start`` to ``end``
    over ``decay_steps``, then ``end``."""
    if decay_steps <= 0:
        return end
    frac = min(env_steps / decay_steps, 1.0)
    return (1.0 - frac) * start + frac * end


def epsilon_greedy(q: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """One action per row of ``q`` (``[N, A]``): uniform with probability ``eps``, else
    the argmax."""
    greedy = np.argmax(q, axis=-1)
    explore = rng.random(q.shape[0]) < eps
    return np.where(explore, rng.integers(0, q.shape[-1], q.shape[0]), greedy)
