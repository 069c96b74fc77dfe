"""IMPACT (Luo et al., ICLR'20): PPO-style clipping made safe for asynchronous learners.

Three policies meet in a batch: the behaviour policy ``mu`` of the worker that acted, a
*target* policy ``pi_target`` (a copy of the parameters the parameter actor refreshes every
``target_update_every`` updates) and the learner's current ``pi_theta``. IMPACT's objective
(Sec. 3.1, "the IMPACT objective"; the form of the authors' own implementation, RLlib's APPO,
which cites that section) clips the ratio to the *target* network, with the target-to-worker
importance ratio truncated at ``rho = target_is_clip``::

    r_t  = min(mu / pi_target, rho) * pi_theta / mu
    L_pi = -mean(min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t))

While ``mu / pi_target <= rho`` this is ``r_t = pi_theta / pi_target``: the trust region is
around the slowly moving target, so it stays meaningful however stale the behaviour data
(clipping ``pi_theta / mu`` instead, a trust region around the stale behaviour policy, was
this module's defect until the fix). Where the worker's policy is far likelier than the
target's (``mu / pi_target > rho``) the ratio is damped to ``rho * pi_theta / mu``.
``A_t`` and the value targets come from V-trace between the target and the behaviour policy
(:mod:`dask_rl.algos.vtrace`, with ``min(rho_bar, pi_target / mu)`` truncation), and the value
loss is ``0.5 (V - v_s)^2``. The runtime keeps the target network and replays each batch up to
``replay`` times from a circular buffer, because :attr:`IMPACT.needs` asks for both.

The equation number of the objective in arXiv 1912.00167 could not be checked offline; the
section and the authors' implementation are the references.

Deviations, both shared with this package's PPO: advantages are normalised per minibatch
(``norm_adv``, CleanRL's practice; neither the paper nor APPO does it), and the V-trace targets
are computed once per batch under the critic the learner starts from (APPO recomputes them
every step under the current critic) — a learner's local epochs see fixed targets, as PPO's
see fixed GAE advantages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from dask_rl.algos import ppo
from dask_rl.algos.base import Batch, LearnerAlgorithm, Needs, SampleWeights
from dask_rl.algos.ppo import clipped_surrogate, normalize, truncation_stats
from dask_rl.algos.vtrace import vtrace
from dask_rl.config.schema import AlgoConfig, option
from dask_rl.data import Trajectory


@dataclass(frozen=True, kw_only=True)
class IMPACTConfig(AlgoConfig):
    name: Literal["impact"] = option("impact", "algorithm")
    gamma: float = option(0.99, "discount", ge=0, le=1)
    clip_coef: float = option(0.4, "surrogate clipping epsilon on pi/pi_target", gt=0)
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    ent_coef: float = option(0.01, "entropy bonus coefficient", ge=0)
    rho_bar: float = option(1.0, "V-trace rho-bar truncation", gt=0)
    c_bar: float = option(1.0, "V-trace c-bar truncation", gt=0)
    gae_lambda: float = option(1.0, "lambda of V-trace(lambda) (IMPALA Remark 2; IMPACT's "
                                    "V-GAE): c_i = lambda min(c_bar, pi/mu); 1: plain V-trace",
                               ge=0, le=1)
    target_is_clip: float = option(2.0, "truncation of the behaviour->target IS ratio", gt=0)
    target_update_every: int = option(2, "refresh the target network every N updates", ge=1)
    replay: int = option(2, "times each batch is replayed from the circular buffer (K)", ge=1)
    buffer_size: int = option(8, "trajectories kept in the circular buffer", ge=1)
    norm_adv: bool = option(True, "normalise advantages per minibatch")


def denominator_logp(logp: torch.Tensor, target_logp: torch.Tensor,
                     rho: float) -> torch.Tensor:
    """``log D`` with ``r = pi_theta / D``: ``D = mu / min(mu / pi_target, rho)``."""
    return logp - torch.clamp(logp - target_logp, max=float(np.log(rho)))


class IMPACT(LearnerAlgorithm):
    """IMPACT's surrogate on V-trace targets (see the module docstring)."""

    name = "impact"
    config_class = IMPACTConfig
    cfg: IMPACTConfig

    @property
    def needs(self) -> Needs:
        cfg = self.cfg
        return Needs(target_network_every=cfg.target_update_every, replay=cfg.replay,
                     replay_capacity=cfg.buffer_size, discount=cfg.gamma)

    @torch.no_grad()
    def prepare(self, traj: Trajectory, model: torch.nn.Module, *, device: torch.device,
                rewards: np.ndarray, target_logp: np.ndarray | None = None) -> Batch:
        """Flatten a trajectory with V-trace targets computed for the target policy."""
        cfg = self.cfg
        T, N = traj.num_steps, traj.num_envs
        flat_obs, values_, nv = ppo.values(traj, model, device=device)
        if target_logp is None:  # no target network yet: the target is the behaviour policy
            target_logp = traj.behaviour_logp
        target_logp = np.asarray(target_logp, np.float32).reshape(T, N)
        log_rhos = target_logp - traj.behaviour_logp
        vs, pg_adv = vtrace(log_rhos, rewards, values_, nv, traj.terminated | traj.truncated,
                            cfg.gamma, rho_bar=cfg.rho_bar, c_bar=cfg.c_bar,
                            lam=cfg.gae_lambda)
        actions = torch.as_tensor(traj.actions, device=device)

        def flat(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(x, np.float32),
                                   device=device).reshape(-1)

        logp, tgt = flat(traj.behaviour_logp), flat(target_logp)
        return Batch(
            obs=flat_obs,
            actions=actions.reshape(T * N, *actions.shape[2:]),
            logp=logp,
            target_logp=tgt,
            ratio_logp=denominator_logp(logp, tgt, cfg.target_is_clip),
            advantages=flat(pg_adv),
            returns=flat(vs),
            values=flat(values_),
        )

    def loss(self, model: torch.nn.Module, mb: Batch, *,
             sample_weight: SampleWeights | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """IMPACT loss on one minibatch: ``(loss, stats)``."""
        cfg = self.cfg
        assert mb.target_logp is not None, "IMPACT batches carry the target's log-probabilities"
        log_d = denominator_logp(mb.logp, mb.target_logp, cfg.target_is_clip)
        dist, newvalue = model(mb.obs)
        newlogp = dist.log_prob(mb.actions)
        entropy = dist.entropy().mean()
        logratio = newlogp - log_d
        ratio = logratio.exp()
        weight = None if sample_weight is None else sample_weight(ratio, mb)
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
            target_weight = (mb.logp - log_d).exp()  # min(mu / pi_target, rho)
        advantages = normalize(mb.advantages) if cfg.norm_adv else mb.advantages
        pg_loss = clipped_surrogate(logratio, advantages, cfg.clip_coef, weight)
        v_loss = 0.5 * ((newvalue - mb.returns) ** 2).mean()
        total = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        stats = {"losses/policy_loss": pg_loss.item(), "losses/value_loss": v_loss.item(),
                 "losses/entropy": entropy.item(), "losses/approx_kl": approx_kl.item(),
                 "losses/clipfrac": clipfrac.item(),
                 "losses/target_weight": target_weight.mean().item(),
                 **truncation_stats(ratio, weight)}
        return total, stats
