"""A compact Soft Actor-Critic, added from outside dask-rl: continuous actions, a replay buffer.

Haarnoja, Zhou, Hartikainen, Tucker, Ha, Tan, Kumar, Zhu, Gupta, Abbeel and Levine, "Soft
Actor-Critic Algorithms and Applications" (arXiv:1812.05905, 2018), the version without a
separate value network, with two Q-functions and a learned temperature:

* soft Q targets (Eq. 3 and 5, one sample of ``a' ~ pi(.|s')`` as in Eq. 6, with the minimum
  of two target Q-functions of Sec. 6):
  ``y = r + gamma (1 - d) (min_j Q_target_j(s', a') - alpha log pi(a'|s'))``;
  ``J_Q = E[1/2 (Q_j(s, a) - y)^2]`` for each ``j``;
* the policy (Eq. 7, reparameterised as Eq. 8-9: ``a = f(eps; s)``):
  ``J_pi = E[alpha log pi(a|s) - min_j Q_j(s, a)]``;
* the temperature (Eq. 18): ``J(alpha) = E[-alpha log pi(a|s) - alpha H_bar]``, with the
  target entropy ``H_bar = -dim(A)`` (App. D, Table 1);
* the squashed Gaussian (Haarnoja et al., ICML 2018, Appendix C, Eq. 21):
  ``a = tanh(u) * scale``, ``log pi(a|s) = log N(u) - sum_i log(scale (1 - tanh(u_i)^2))``.

Deviations. For the runtime it runs on: the target network is a hard copy refreshed by the
parameter actor every ``target_every`` learner tasks, not Polyak averaging (tau = 0.005); the
three losses are summed and minimised in one step by the learner's one Adam over all
parameters, with one learning rate, Adam epsilon and (if ``learner.max_grad_norm`` > 0) one
global norm clip — Algorithm 1 steps Q, pi and alpha in turn; each loss reaches only its own
parameters (the policy loss sees the Q-functions through detached parameters, the Q targets
and alpha's factor elsewhere are constants). As the authors' code does: the temperature's
loss is taken in ``log alpha`` (``-log alpha (log pi + H_bar)``: Eq. 18's gradient divided by
alpha, the same fixed point), and the policy's log standard deviation is clamped to
[-5, 2]. For a short test: two hidden layers of ``hidden`` = 128 units and batches of 128 (the
paper: 256 and 256), and rollouts act uniformly at random for the first ``random_steps`` env
steps. Only one-step targets (``n_step`` = 1: an n-step sum would drop the entropy terms in
between) and 1-D action boxes symmetric about 0.

This module and its ``register`` call are all it takes: no dask-rl file knows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from dask_rl.algos import registry
from dask_rl.algos.base import Needs
from dask_rl.algos.replay import ReplayAlgorithm, ReplayConfig
from dask_rl.config.schema import option

LOG_STD = (-5.0, 2.0)  # the policy's log standard deviation is kept in this range


@dataclass(frozen=True, kw_only=True)
class SACConfig(ReplayConfig):
    name: Literal["sac"] = option("sac", "algorithm")
    n_step: int = option(1, "steps of the return: 1 (soft targets have no n-step form here)",
                         ge=1, le=1)
    hidden: int = option(128, "units of each of the two hidden layers", ge=1)
    random_steps: int = option(1000, "env steps of uniformly random actions at the start", ge=0)
    init_alpha: float = option(1.0, "the temperature at the start", gt=0)


def _mlp(n_in: int, n_out: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, n_out))


class SquashedGaussian:
    """``a = tanh(u) * scale`` with ``u ~ N(mean, std)``; the log-density of Eq. 21."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, scale: torch.Tensor):
        self.mean, self.log_std, self.scale = mean, log_std, scale

    def rsample(self, generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device,
                            dtype=self.mean.dtype)
        u = self.mean + self.log_std.exp() * noise
        gauss = (-0.5 * noise ** 2 - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|
        log_det = (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))
                   + torch.log(self.scale)).sum(-1)
        return torch.tanh(u) * self.scale, gauss - log_det

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.rsample(generator)[0]

    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean) * self.scale


class SACModel(nn.Module):
    """The policy, two Q-functions and ``log alpha``, in one module (one flat parameter
    vector for the parameter actor)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int, scale: np.ndarray,
                 init_alpha: float):
        super().__init__()
        self.actor = _mlp(obs_dim, 2 * action_dim, hidden)
        self.q1 = _mlp(obs_dim + action_dim, 1, hidden)
        self.q2 = _mlp(obs_dim + action_dim, 1, hidden)
        self.log_alpha = nn.Parameter(torch.tensor([math.log(init_alpha)]))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))

    def policy(self, obs: torch.Tensor) -> SquashedGaussian:
        mean, log_std = self.actor(obs.float().flatten(1)).chunk(2, -1)
        return SquashedGaussian(mean, log_std.clamp(*LOG_STD), self.scale)

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.policy(obs)
        if greedy:
            return dist.mode(), torch.zeros(obs.shape[0])
        return dist.rsample(generator)

    def q(self, obs: torch.Tensor, actions: torch.Tensor, params: dict | None = None
          ) -> torch.Tensor:
        """``min(Q_1, Q_2)(s, a)``; with ``params`` (the Q-functions' own, e.g. detached)."""
        x = torch.cat([obs.float().flatten(1), actions.float()], -1)
        if params is None:
            return torch.min(self.q1(x), self.q2(x)).squeeze(-1)
        q1 = functional_call(self.q1, params["q1"], (x,))
        q2 = functional_call(self.q2, params["q2"], (x,))
        return torch.min(q1, q2).squeeze(-1)


class SAC(ReplayAlgorithm):
    """Soft Actor-Critic with two Q-functions and a learned temperature (see the module)."""

    name = "sac"
    config_class = SACConfig
    cfg: SACConfig

    @property
    def needs(self) -> Needs:
        return Needs(target_network_every=self.cfg.target_every, discount=self.cfg.gamma)

    def make_model(self, obs_space, action_space, model_cfg, *, normalize_obs=False,
                   seed=None) -> SACModel:
        low, high = np.asarray(action_space.low), np.asarray(action_space.high)
        if len(action_space.shape) != 1 or not np.allclose(low, -high):
            raise ValueError(f"sac: 1-D action boxes symmetric about 0 only, got {action_space}")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            return SACModel(int(np.prod(obs_space.shape)), action_space.shape[0],
                            self.cfg.hidden, high, self.cfg.init_alpha)

    def loss(self, model: SACModel, target: SACModel, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
        obs, actions = batch["obs"], batch["actions"]
        alpha = model.log_alpha.exp().detach()
        with torch.no_grad():   # the soft Q target y (Eq. 3, 5)
            next_actions, next_logp = model.policy(batch["next_obs"]).rsample()
            soft_v = target.q(batch["next_obs"], next_actions) - alpha * next_logp
            y = batch["returns"] + batch["discounts"] * soft_v
        x = torch.cat([obs.float().flatten(1), actions.float()], -1)
        q_loss = (0.5 * (model.q1(x).squeeze(-1) - y) ** 2).mean() \
            + (0.5 * (model.q2(x).squeeze(-1) - y) ** 2).mean()
        new_actions, logp = model.policy(obs).rsample()
        frozen = {name: {k: v.detach() for k, v in getattr(model, name).named_parameters()}
                  for name in ("q1", "q2")}
        pi_loss = (alpha * logp - model.q(obs, new_actions, frozen)).mean()       # Eq. 7
        target_entropy = -float(actions.shape[-1])
        alpha_loss = -(model.log_alpha * (logp.detach() + target_entropy)).mean()  # Eq. 18
        loss = q_loss + pi_loss + alpha_loss
        return loss, {"losses/q_loss": float(q_loss.detach()),
                      "losses/pi_loss": float(pi_loss.detach()),
                      "losses/alpha": float(alpha), "losses/entropy": float(-logp.detach().mean())}

    def exploration(self, env_steps: int) -> float:
        """1 (uniformly random actions) for the first ``random_steps``, then 0."""
        return 1.0 if env_steps < self.cfg.random_steps else 0.0

    def act(self, model: SACModel, obs: torch.Tensor, exploration: float, *,
            rng: np.random.Generator, generator: torch.Generator) -> np.ndarray:
        if exploration >= 1.0:
            scale = model.scale.numpy()
            return rng.uniform(-scale, scale, (obs.shape[0], *scale.shape)).astype(np.float32)
        return model.policy(obs).sample(generator).numpy()


registry.register(SAC)
