"""IMPACT (Luo et al., ICLR'20): PPO-style clipping made safe for asynchronous learners.

Three policies meet in a batch: the behaviour policy ``mu`` that acted, a *target* policy
``pi_target`` (a copy of the parameters the parameter actor refreshes every
``target_update_every`` updates), and the learner's current ``pi_theta``. The surrogate clips
the ratio ``pi_theta / pi_target`` — the target moves slowly, so clipping stays meaningful
however stale the behaviour data — and weights it with the truncated importance ratio
``w = min(pi_target / mu, target_is_clip)`` (RLlib APPO's form)::

    r    = w * pi_theta / pi_target
    L_pi = -mean(min(A r, A clip(r, 1 - eps, 1 + eps)))

Advantages and value targets come from V-trace between the target and the behaviour policy
(:mod:`dask_rl.algos.vtrace`). The driver's circular buffer replays each batch up to
``replay`` times.
"""

from __future__ import annotations

import numpy as np
import torch

from dask_rl.algos import ppo
from dask_rl.algos.ppo import Batch, clipped_surrogate, normalize, truncated_ratio
from dask_rl.algos.vtrace import vtrace
from dask_rl.config import IMPACTConfig
from dask_rl.types import Trajectory

needs_target = True


@torch.no_grad()
def prepare(traj: Trajectory, model: torch.nn.Module, cfg: IMPACTConfig, *,
            device: torch.device, rewards: np.ndarray | None = None,
            target_logp: np.ndarray | None = None) -> Batch:
    """Flatten a trajectory with V-trace targets computed for the target policy."""
    T, N = traj.num_steps, traj.num_envs
    flat_obs, values_, nv = ppo.values(traj, model, device=device)
    rewards = traj.rewards.astype(np.float32) if rewards is None else rewards
    if target_logp is None:  # the target is the learner's starting point
        target_logp = traj.behaviour_logp
    target_logp = np.asarray(target_logp, np.float32).reshape(T, N)
    log_rhos = target_logp - traj.behaviour_logp
    vs, pg_adv = vtrace(log_rhos, rewards, values_, nv, traj.terminated | traj.truncated,
                        cfg.gamma, rho_bar=cfg.rho_bar, c_bar=cfg.c_bar)
    actions = torch.as_tensor(traj.actions, device=device)

    def flat(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x, np.float32), device=device).reshape(-1)

    return {
        "obs": flat_obs,
        "actions": actions.reshape(T * N, *actions.shape[2:]),
        "logp": flat(traj.behaviour_logp),
        "target_logp": flat(target_logp),
        "advantages": flat(pg_adv),
        "returns": flat(vs),
        "values": flat(values_),
    }


def loss(model: torch.nn.Module, mb: Batch, cfg: IMPACTConfig, *, is_rho: float = 1.0):
    """IMPACT loss on one minibatch: ``(loss, stats)``."""
    dist, newvalue = model(mb["obs"])
    newlogp = dist.log_prob(mb["actions"])
    entropy = dist.entropy().mean()
    is_weight = torch.clamp((mb["target_logp"] - mb["logp"]).exp(), max=cfg.target_is_clip)
    logratio = newlogp - mb["target_logp"]
    ratio = truncated_ratio(logratio.exp(), mb.get("cross_ratio_min"), is_rho)
    with torch.no_grad():
        approx_kl = (((logratio.exp()) - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
    advantages = normalize(mb["advantages"]) if cfg.norm_adv else mb["advantages"]
    pg_loss = clipped_surrogate(is_weight * ratio, advantages, cfg.clip_coef)
    v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
    total = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
    stats = {"losses/policy_loss": pg_loss.item(), "losses/value_loss": v_loss.item(),
             "losses/entropy": entropy.item(), "losses/approx_kl": approx_kl.item(),
             "losses/clipfrac": clipfrac.item(),
             "losses/is_weight": is_weight.mean().item()}
    return total, stats
