"""Learning from one batch: the single-process building block of a learner task.

A learner receives the policy version it pulled and one trajectory, runs the algorithm's
epochs x minibatches of Adam steps from that version, and returns the update it found as a
*gradient*: ``g = theta_pulled - theta_local``. The parameter actor applies ``g`` (alone,
averaged or staleness-scaled, as its strategy decides) with step size alpha0. One push per batch
keeps learner tasks coarse, as on a cluster they must be (cf. local SGD and FedAsync, whose
polynomial staleness weights Stellaris' alpha0 / delta^(1/v) resembles).

The learners' Adam moments are part of the parameter actor's state: a learner starts from the
moments of the version it pulled and returns its own, which the actor averages over the
gradients of each update. A fresh Adam per batch measurably slows PPO (CartPole: ~280k steps
to solve instead of ~170k), and with one learner, the ``sync`` strategy and alpha0 = 1 this
makes the distributed run exactly single-process PPO.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from gymnasium import spaces

from dask_rl.algos import get_algorithm
from dask_rl.config import PipelineConfig
from dask_rl.envs import is_atari
from dask_rl.models import get_flat, load_snapshot, make_model, resolve_device
from dask_rl.types import LearnerResult, PolicySnapshot, Trajectory


class Learner:
    """Computes updates for one pipeline; keeps its network between calls (cheap reuse)."""

    def __init__(self, cfg: PipelineConfig, obs_space: spaces.Space, action_space: spaces.Space,
                 *, device: str | torch.device | None = None):
        self.cfg = cfg
        self.device = resolve_device(device or cfg.learner.device) if not isinstance(
            device, torch.device) else device
        self.algo = get_algorithm(cfg.algo.name)
        self.model = make_model(obs_space, action_space, cfg.model,
                                normalize_obs=cfg.env.normalize_obs).to(self.device)
        self.clip_rewards = is_atari(cfg.env.id) and cfg.env.clip_rewards

    def update(self, snapshot: PolicySnapshot, traj: Trajectory, *, lr: float,
               seed: int, cross_policies: list[PolicySnapshot] | None = None) -> LearnerResult:
        """Local epochs on ``traj`` from ``snapshot``; returns the update as a gradient."""
        t0 = time.perf_counter()
        cfg, lcfg = self.cfg, self.cfg.learner
        model = self.model
        load_snapshot(model, snapshot)
        batch = self.algo.prepare(traj, model, cfg.algo, device=self.device,
                                  clip_rewards=self.clip_rewards)
        if cross_policies:
            batch["cross_ratio_min"] = self._cross_ratio_min(batch, cross_policies)
            load_snapshot(model, snapshot)
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=lcfg.adam_eps, foreach=True)
        if snapshot.opt_state is not None:
            load_adam_state(optimizer, model, snapshot.opt_state)
        generator = torch.Generator().manual_seed(seed)
        size = len(batch["advantages"])
        mb_size = size // lcfg.minibatches
        epoch_stats: list[dict] = []
        epochs_run = 0
        for _ in range(lcfg.epochs):
            perm = torch.randperm(size, generator=generator).to(self.device)
            epoch_stats = []
            for k in range(lcfg.minibatches):
                idx = perm[k * mb_size:(k + 1) * mb_size]
                mb = {key: value[idx] for key, value in batch.items()}
                loss, stats = self.algo.loss(model, mb, cfg.algo, is_rho=lcfg.is_rho)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if lcfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), lcfg.max_grad_norm)
                optimizer.step()
                epoch_stats.append(stats)
            epochs_run += 1
            target_kl = getattr(cfg.algo, "target_kl", None)
            if target_kl is not None and np.mean(
                    [s["losses/approx_kl"] for s in epoch_stats]) > target_kl:
                break
        gradient = snapshot.params - get_flat(model)
        stats = {k: float(np.mean([s[k] for s in epoch_stats])) for k in epoch_stats[0]}
        stats.update(_explained_variance(batch))
        stats["learner/epochs"] = epochs_run
        stats["learner/samples"] = size
        stats["learner/time_s"] = time.perf_counter() - t0
        stats["learner/update_norm"] = float(np.linalg.norm(gradient))
        return LearnerResult(gradient=gradient.astype(np.float32, copy=False),
                             version=snapshot.version, stats=stats,
                             opt_state=dump_adam_state(optimizer, model))

    @torch.no_grad()
    def _cross_ratio_min(self, batch: dict, policies: list[PolicySnapshot]) -> torch.Tensor:
        """``min_i pi_theta_i(a|s) / mu(a|s)`` over the other active learners' policies."""
        model = self.model
        ratios = []
        for snap in policies:
            load_snapshot(model, snap)
            dist = model.policy(batch["obs"])
            ratios.append((dist.log_prob(batch["actions"]) - batch["logp"]).exp())
        return torch.stack(ratios).min(0).values


def _explained_variance(batch: dict) -> dict:
    y_true = batch["returns"]
    var = y_true.var()
    if var == 0:
        return {"losses/explained_variance": float("nan")}
    ev = 1 - (y_true - batch["values"]).var() / var
    return {"losses/explained_variance": float(ev)}


def dump_adam_state(optimizer: torch.optim.Adam, model: torch.nn.Module) -> dict:
    """Adam's moments as flat float32 vectors aligned with :func:`~dask_rl.models.get_flat`."""
    m, v, t = [], [], 0
    for p in model.parameters():
        st = optimizer.state.get(p)
        if not st:
            m.append(torch.zeros(p.numel()))
            v.append(torch.zeros(p.numel()))
            continue
        m.append(st["exp_avg"].detach().reshape(-1).cpu())
        v.append(st["exp_avg_sq"].detach().reshape(-1).cpu())
        t = int(st["step"])
    return {"m": torch.cat(m).numpy(), "v": torch.cat(v).numpy(), "t": t}


def load_adam_state(optimizer: torch.optim.Adam, model: torch.nn.Module, state: dict) -> None:
    """Set Adam's moments (and step count) from flat vectors made by :func:`dump_adam_state`."""
    if state["t"] == 0:
        return
    m = torch.as_tensor(state["m"])
    v = torch.as_tensor(state["v"])
    offset = 0
    for p in model.parameters():
        k = p.numel()
        optimizer.state[p] = {
            "step": torch.tensor(float(state["t"])),
            "exp_avg": m[offset:offset + k].view_as(p).to(p.device, copy=True),
            "exp_avg_sq": v[offset:offset + k].view_as(p).to(p.device, copy=True),
        }
        offset += k
