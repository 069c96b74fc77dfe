"""Proximal Policy Optimization (Schulman et al. 2017) as pure functions.

Names follow the paper and CleanRL's ``ppo.py``: ``delta``, ``lastgaelam``, ``logratio``,
``pg_loss``, ``v_loss``; ``b_`` is the flattened batch, ``mb_`` a minibatch. :meth:`PPO.prepare`
turns a :class:`~dask_rl.data.Trajectory` into a flat :class:`~dask_rl.algos.base.Batch` with
GAE advantages computed under the learner's current value function; :meth:`PPO.loss` is the
clipped surrogate, the clipped value loss and the entropy bonus on one minibatch. The kernels
(GAE, the surrogate, the value loss) are module-level functions, tested against naive loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from dask_rl.algos.base import Batch, LearnerAlgorithm, Needs, SampleWeights
from dask_rl.config.schema import AlgoConfig, option
from dask_rl.data import Trajectory


@dataclass(frozen=True, kw_only=True)
class PPOConfig(AlgoConfig):
    name: Literal["ppo"] = option("ppo", "algorithm")
    gamma: float = option(0.99, "discount", ge=0, le=1)
    gae_lambda: float = option(0.95, "GAE lambda", ge=0, le=1)
    clip_coef: float = option(0.2, "surrogate clipping epsilon", gt=0)
    clip_vloss: bool = option(True, "clip the value loss around the learner's values "
                                    "before its update (within clip_coef)")
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    ent_coef: float = option(0.01, "entropy bonus coefficient", ge=0)
    norm_adv: bool = option(True, "normalise advantages per minibatch")
    target_kl: float | None = option(None, "stop a learner's epochs early above this KL", gt=0)


def next_values(values: np.ndarray, last_value: np.ndarray, terminated: np.ndarray,
                truncated: np.ndarray, trunc_index: np.ndarray,
                trunc_values: np.ndarray) -> np.ndarray:
    """V(s_{t+1}) for every step: 0 after termination, V(final obs) after truncation.

    With same-step autoreset ``values[t + 1]`` belongs to the next episode whenever step ``t``
    ended one, so those entries are replaced.
    """
    nv = np.empty_like(values)
    nv[:-1] = values[1:]
    nv[-1] = last_value
    nv[terminated | truncated] = 0.0
    if len(trunc_index):
        t, n = trunc_index[:, 0], trunc_index[:, 1]
        nv[t, n] = np.where(terminated[t, n], 0.0, trunc_values)
    return nv


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
        episode_end: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates (Schulman et al. 2016), ``[T, N]``.

    ``episode_end[t]`` (terminated or truncated) stops the recursion; bootstrapping is already
    in ``next_values``.
    """
    advantages = np.zeros_like(values)
    lastgaelam = np.zeros_like(values[0])
    not_end = 1.0 - episode_end.astype(values.dtype)
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        lastgaelam = delta + gamma * lam * not_end[t] * lastgaelam
        advantages[t] = lastgaelam
    return advantages


def normalize(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit standard deviation (advantage normalisation)."""
    if x.numel() < 2:
        return x - x.mean()
    return (x - x.mean()) / (x.std() + eps)


def clipped_surrogate(logratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float,
                      weight: torch.Tensor | None = None) -> torch.Tensor:
    """The PPO-clip policy loss ``-mean(min(r A, clip(r, 1-eps, 1+eps) A))`` with
    ``r = exp(logratio)`` (Schulman et al. 2017, Eq. 7), optionally with a per-sample
    importance weight (Stellaris' truncation).

    ``weight`` (detached, see :mod:`dask_rl.staleness.truncation`) replaces ``r`` as the
    importance weight of a sample's policy gradient where the unclipped term is the minimum:
    that term becomes ``weight * A * exp(log r - sg(log r))``, whose value is ``weight * A``
    and whose gradient is ``weight * A * grad log pi`` — the truncated policy gradient of
    Stellaris. Where PPO's clipped term is the minimum, the sample has no gradient, as in PPO.
    (Written without dividing by ``r``, so an extreme ratio that under- or overflows gives no
    NaN.)
    """
    ratio = logratio.exp()
    clipped = torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages
    unclipped = ratio * advantages
    if weight is None:
        return -torch.min(unclipped, clipped).mean()
    use_clipped = (clipped < unclipped).detach()
    weighted = weight * advantages * (logratio - logratio.detach()).exp()
    return -torch.where(use_clipped, clipped, weighted).mean()


def value_loss(newvalue: torch.Tensor, oldvalue: torch.Tensor, returns: torch.Tensor,
               clip_coef: float | None) -> torch.Tensor:
    """Half squared error, clipped around ``oldvalue`` when ``clip_coef`` is given."""
    v_loss_unclipped = (newvalue - returns) ** 2
    if clip_coef is None:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
    v_loss_clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()


@torch.no_grad()
def truncation_stats(ratio: torch.Tensor, weight: torch.Tensor | None) -> dict[str, float]:
    """How much the truncation changed: the share of samples whose weight is below ``r``."""
    if weight is None:
        return {}
    return {"losses/is_truncated_frac": (weight < ratio - 1e-7).float().mean().item(),
            "losses/is_weight_mean": weight.mean().item()}


@torch.no_grad()
def values(traj: Trajectory, model: torch.nn.Module, *,
           device: torch.device) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Flat observations ``[T*N, ...]``, ``V(s_t)`` and ``V(s_{t+1})`` (``[T, N]`` each) under
    the learner's current critic, bootstrapped as :func:`next_values` says."""
    T, N = traj.num_steps, traj.num_envs
    obs = torch.as_tensor(traj.obs, device=device)
    flat_obs = obs.reshape(T * N, *obs.shape[2:])
    tail = [torch.as_tensor(traj.last_obs, device=device)]
    if len(traj.trunc_index):
        tail.append(torch.as_tensor(traj.trunc_obs, device=device))
    v = model.value(flat_obs).reshape(T, N).cpu().numpy()
    tail_values = model.value(torch.cat(tail)).cpu().numpy()
    nv = next_values(v, tail_values[:N], traj.terminated, traj.truncated, traj.trunc_index,
                     tail_values[N:])
    return flat_obs, v, nv


class PPO(LearnerAlgorithm):
    """PPO-clip: the objective ``L^{CLIP+VF+S}`` of Schulman et al. 2017 (Eq. 9, with
    ``L^CLIP`` of Eq. 7) on GAE advantages (Eq. 11-12; Schulman et al. 2016, Eq. 16).

    Deviations, as in CleanRL's ``ppo.py``: the value loss is the half squared error
    (``L^VF = 1/2 (V - V_targ)^2``; Eq. 9 has no 1/2, so ``vf_coef`` 0.5 weighs it as
    CleanRL's does), clipped (``clip_vloss``) within the surrogate's own epsilon
    (``clip_coef``; the paper does not clip it) around the values of ``prepare`` (the
    learner's model before its update, not the behaviour policy's: rollouts do not store
    values, so with stale samples the two differ; CleanRL's are the same model), advantages
    are normalised per minibatch (``norm_adv``), and with
    ``learner.is_truncation`` each sample's importance weight is Stellaris' ``R'``
    (:mod:`dask_rl.staleness.truncation`).
    """

    name = "ppo"
    config_class = PPOConfig
    cfg: PPOConfig

    @property
    def needs(self) -> Needs:
        return Needs(discount=self.cfg.gamma)

    @torch.no_grad()
    def prepare(self, traj: Trajectory, model: torch.nn.Module, *, device: torch.device,
                rewards: np.ndarray, target_logp: np.ndarray | None = None) -> Batch:
        """Flatten a trajectory into a training batch with GAE advantages and returns."""
        cfg = self.cfg
        T, N = traj.num_steps, traj.num_envs
        flat_obs, values_, nv = values(traj, model, device=device)
        episode_end = traj.terminated | traj.truncated
        advantages = gae(rewards, values_, nv, episode_end, cfg.gamma, cfg.gae_lambda)
        returns = advantages + values_
        actions = torch.as_tensor(traj.actions, device=device)
        return Batch(
            obs=flat_obs,
            actions=actions.reshape(T * N, *actions.shape[2:]),
            logp=torch.as_tensor(traj.behaviour_logp, device=device).reshape(-1),
            advantages=torch.as_tensor(advantages, device=device).reshape(-1),
            returns=torch.as_tensor(returns, device=device).reshape(-1),
            values=torch.as_tensor(values_, device=device).reshape(-1),
        )

    def loss(self, model: torch.nn.Module, mb: Batch, *,
             sample_weight: SampleWeights | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO loss on one minibatch: ``(loss, stats)`` with CleanRL's diagnostics."""
        cfg = self.cfg
        dist, newvalue = model(mb.obs)
        newlogp = dist.log_prob(mb.actions)
        entropy = dist.entropy().mean()
        logratio = newlogp - mb.logp
        ratio = logratio.exp()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
        weight = None if sample_weight is None else sample_weight(ratio, mb)
        mb_advantages = normalize(mb.advantages) if cfg.norm_adv else mb.advantages
        pg_loss = clipped_surrogate(logratio, mb_advantages, cfg.clip_coef, weight)
        v_loss = value_loss(newvalue, mb.values, mb.returns,
                            cfg.clip_coef if cfg.clip_vloss else None)
        total = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        stats = {"losses/policy_loss": pg_loss.item(), "losses/value_loss": v_loss.item(),
                 "losses/entropy": entropy.item(), "losses/approx_kl": approx_kl.item(),
                 "losses/clipfrac": clipfrac.item(), **truncation_stats(ratio, weight)}
        return total, stats

    def stop_epochs(self, epoch_stats: list[dict[str, float]]) -> bool:
        """CleanRL's early stop: the epoch's mean approximate KL exceeded ``target_kl``."""
        target_kl = self.cfg.target_kl
        return target_kl is not None and bool(epoch_stats) and float(
            np.mean([s["losses/approx_kl"] for s in epoch_stats])) > target_kl
