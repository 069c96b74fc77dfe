"""Double DQN with n-step returns: the math, time-major ``[T, N]``, apart from any runtime.

Double Q-learning's target (van Hasselt, Guez and Silver, AAAI 2016, Eq. 4): the online
network picks the next action, the target network values it,

    Y_t = R_{t+1} + gamma Q(S_{t+1}, argmax_a Q(S_{t+1}, a; theta_t); theta^-_t),

extended to ``n`` steps as in Rainbow (Hessel et al., AAAI 2018, Sec. "Multi-step learning"):
``G_t^(n) = sum_{k<m} gamma^k R_{t+k+1} + gamma^m Q_double(S_{t+m})``, the n-step transitions
every replay algorithm samples (:mod:`dask_rl.algos.replay`, which states ``m`` and where the
sum is cut). The loss is the Huber loss of ``Q(S_t, A_t; theta) - G_t`` (DQN's clipping of the
error to [-1, 1]: Mnih et al., Nature 2015, Methods, "Training algorithm").

Exploration is epsilon-greedy with epsilon decayed linearly (Mnih et al. 2015: 1 to 0.1 over
the first million frames; the end point and length are configurable, and the default end is
0.05, as in the Rainbow-era baselines, not Nature's 0.1). Epsilon is fixed per rollout: a
rollout acts with the value for the env steps collected when it was submitted, so the schedule
is a staircase with steps of ``rollout.steps x env.num_envs``.

Deviations: learners are asynchronous tasks (TianJi's relaxed dependencies): each pulls the
parameters and the target network, takes ``updates_per_task`` Adam steps on batches of
``batch_size`` sampled transitions and pushes the change, as PPO's learners do; the target
network is refreshed by the parameter actor every ``target_every`` versions (with
``aggregation.strategy: async``, the only one DQN accepts, a version is one learner task), i.e.
every ``target_every x updates_per_task`` gradient steps (3,200 by default; Nature's C is
10,000). The optimizer is Adam (as in Rainbow), not Nature's RMSProp, and the learner clips
the gradient's global norm to ``learner.max_grad_norm`` (0.5, the learners' shared default) on
top of the Huber loss; Nature clips only the error. Its Q-network is the policy head of
the actor-critic models (the value head is unused): the greedy policy is the argmax of ``Q``.
TianJi's notes also keep "shadow parameters", a delayed copy for acting decisions; they are not
built: rollouts act with the parameters they last pulled (which
``rollout.pull_every``/``pull_min_versions`` can already delay), and the target network is the
delayed copy the learners use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from dask_rl.algos.base import Needs
from dask_rl.algos.replay import ReplayAlgorithm, ReplayConfig
from dask_rl.config.schema import option


@dataclass(frozen=True, kw_only=True)
class DQNConfig(ReplayConfig):
    name: Literal["dqn"] = option("dqn", "algorithm")
    eps_start: float = option(1.0, "epsilon-greedy's epsilon at the start", ge=0, le=1)
    eps_end: float = option(0.05, "... at the end of the decay", ge=0, le=1)
    eps_decay_steps: int = option(20_000, "env steps of the linear decay", ge=0)


class DQN(ReplayAlgorithm):
    """Double DQN with n-step returns: the Huber loss of ``Q(s, a) - G^(n)`` with the double-Q
    bootstrap (van Hasselt et al. 2016, Eq. 4; Hessel et al. 2018, multi-step learning)."""

    name = "dqn"
    config_class = DQNConfig
    cfg: DQNConfig
    discrete_actions = True
    stochastic_policy = False

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

    def exploration(self, env_steps: int) -> float:
        """Epsilon, decayed linearly (:func:`epsilon`)."""
        return epsilon(env_steps, start=self.cfg.eps_start, end=self.cfg.eps_end,
                       decay_steps=self.cfg.eps_decay_steps)

    def act(self, model: torch.nn.Module, obs: torch.Tensor, exploration: float, *,
            rng: np.random.Generator, generator: torch.Generator) -> np.ndarray:
        """Epsilon-greedy on the model's action values."""
        return epsilon_greedy(model.q_values(obs).numpy(), exploration, rng)


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
