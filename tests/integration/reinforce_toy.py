"""A toy algorithm added from outside dask-rl: REINFORCE with a learned baseline.

Williams (1992); with the baseline of Sutton & Barto (2018, Sec. 13.4):
``grad J = E[ grad log pi(a_t|s_t) (G_t - V(s_t)) ]`` with ``G_t = sum_k gamma^k r_{t+k}``,
cut at episode ends and bootstrapped with ``V`` where a trajectory or an episode is cut short.
This module and its ``register`` call are all it takes: no dask-rl file changes.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from dask_rl.algos import ppo, registry
from dask_rl.algos.base import Batch, LearnerAlgorithm, Needs
from dask_rl.config.schema import AlgoConfig, option


@dataclass(frozen=True, kw_only=True)
class ReinforceConfig(AlgoConfig):
    name: Literal["reinforce"] = option("reinforce", "algorithm")
    gamma: float = option(0.99, "discount", ge=0, le=1)
    vf_coef: float = option(0.5, "baseline loss coefficient", ge=0)


class Reinforce(LearnerAlgorithm):
    name = "reinforce"
    config_class = ReinforceConfig

    @property
    def needs(self) -> Needs:
        return Needs(discount=self.cfg.gamma)

    @torch.no_grad()
    def prepare(self, traj, model, *, device, rewards, target_logp=None) -> Batch:
        obs, v, next_v = ppo.values(traj, model, device=device)
        end = traj.terminated | traj.truncated
        returns = np.zeros_like(v)
        g = next_v[-1]                       # bootstrap where the trajectory stops
        for t in reversed(range(traj.num_steps)):
            g = np.where(end[t], next_v[t], g)   # 0 after termination, V after truncation
            g = rewards[t] + self.cfg.gamma * g
            returns[t] = g
        flat = lambda x: torch.as_tensor(x, device=device).reshape(-1)  # noqa: E731
        actions = torch.as_tensor(traj.actions, device=device)
        return Batch(obs=obs, actions=actions.reshape(-1, *actions.shape[2:]),
                     logp=flat(traj.behaviour_logp), advantages=flat(returns - v),
                     returns=flat(returns), values=flat(v))

    def loss(self, model, mb):
        dist, value = model(mb.obs)
        advantages = ppo.normalize(mb.advantages)
        pg_loss = -(dist.log_prob(mb.actions) * advantages).mean()
        v_loss = 0.5 * ((value - mb.returns) ** 2).mean()
        return pg_loss + self.cfg.vf_coef * v_loss, {"losses/policy_loss": pg_loss.item(),
                                                     "losses/value_loss": v_loss.item()}


registry.register(Reinforce)
