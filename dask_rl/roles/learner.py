"""Learning from one batch: the single-process building block of a learner task.

A learner receives the policy version it pulled and one trajectory, runs the algorithm's
epochs x minibatches of Adam steps from that version, and returns the update it found as a
parameter delta ``g = theta_pulled - theta_local`` (the strategies' *gradient*). The parameter
actor applies ``g`` (alone, averaged or staleness-scaled, as its strategy decides) with step
size alpha0. One push per batch
keeps learner tasks coarse, as on a cluster they must be (cf. local SGD and FedAsync, whose
polynomial staleness weights Stellaris' alpha0 / delta^(1/v) resembles).

The learners' Adam moments are, by default (``learner.optimizer_state = shared``), part of the
parameter actor's state: a learner starts from the moments of the version it pulled and returns
its own, which the actor averages over the gradients of each update. A fresh Adam per batch
measurably slows PPO (CartPole: ~280k steps to solve instead of ~170k), and with one learner,
the ``sync`` strategy and alpha0 = 1 this makes the distributed run exactly single-process PPO.
The price is bytes: every learner pull and push carries two more vectors of the parameters'
size. With ``local``, each learner thread keeps its own moments from one task to the next
(estimated from its own gradients only, and not checkpointed: a new thread or a resumed run
starts them from zero, which Adam's bias correction is built for; a rollback to a checkpoint
or PBT's exploit leaves them as they are: they describe the gradients' scale, not the
parameters), and pulls and pushes carry the parameters alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np
import torch
from gymnasium import spaces

from dask_rl.algos import registry
from dask_rl.algos.base import Batch, LearnerAlgorithm
from dask_rl.algos.optim import Adam
from dask_rl.algos.replay import ReplayAlgorithm, Transitions
from dask_rl.config.schema import PipelineConfig
from dask_rl.data import LearnerUpdate, PolicySnapshot, Trajectory
from dask_rl.envs import is_atari
from dask_rl.models import flatten_, load_snapshot, resolve_device
from dask_rl.models.normalizer import mean_var
from dask_rl.staleness.truncation import GlobalTruncation

#: Publish this learner's flat parameters; returns the other active learners' current ones.
Exchange = Callable[[np.ndarray], "list[np.ndarray]"]


class Learner:
    """Computes updates for one pipeline; keeps its network between calls (cheap reuse).

    The network's parameters live in one flat buffer (:func:`~dask_rl.models.flatten_`), so
    loading a version, clipping the global gradient norm, the Adam step and reading the update
    out are single vector operations, on CPU or GPU alike.
    """

    def __init__(self, cfg: PipelineConfig, obs_space: spaces.Space, action_space: spaces.Space,
                 *, device: str | torch.device | None = None):
        self.cfg = cfg
        self.device = device if isinstance(device, torch.device) else resolve_device(
            device or cfg.learner.device)
        self.algorithm = self._algorithm(None)
        self.spaces = (obs_space, action_space)
        self.model = self._make_model()
        self.flat, self.grad = flatten_(self.model)
        self._peer: torch.nn.Module | None = None  # evaluates other learners' policies
        self.clip_rewards = is_atari(cfg.env) and cfg.env.clip_rewards
        self.local_opt_state: dict | None = None  # learner.optimizer_state = local

    def _make_model(self) -> torch.nn.Module:
        return self.algorithm.make_model(*self.spaces, self.cfg.model,
                                         normalize_obs=self.cfg.env.normalize_obs).to(self.device)

    def _optimizer(self, snapshot: PolicySnapshot) -> Adam:
        """Adam over the flat parameters, from the moments the snapshot carries (shared) or
        from this learner's own (local)."""
        optimizer = Adam(self.flat, eps=self.cfg.learner.adam_eps)
        state = snapshot.opt_state if self.cfg.learner.optimizer_state == "shared" \
            else self.local_opt_state
        if state is not None:
            optimizer.load_state_dict({k: torch.as_tensor(v).to(self.device)
                                       if k != "t" else v for k, v in state.items()})
        return optimizer

    def _opt_state_out(self, optimizer: Adam, finite: bool) -> dict | None:
        """The moments after an update: pushed to the actor (shared), or kept here (local;
        an update that went non-finite keeps the moments from before it)."""
        if self.cfg.learner.optimizer_state == "local":
            if finite:
                self.local_opt_state = {"m": optimizer.m.clone(), "v": optimizer.v.clone(),
                                        "t": optimizer.t}
            return None
        return {"m": optimizer.m.cpu().numpy().copy(), "v": optimizer.v.cpu().numpy().copy(),
                "t": optimizer.t}

    def rewards(self, traj: Trajectory, snapshot: PolicySnapshot) -> np.ndarray:
        """The rewards the loss sees: sign-clipped (Atari) or scaled by the running std of
        discounted returns (``env.normalize_reward``), else raw."""
        rewards = traj.rewards.astype(np.float32)
        if self.clip_rewards:
            return np.sign(rewards)
        if self.cfg.env.normalize_reward and snapshot.moments and "return" in snapshot.moments:
            _, var = mean_var(snapshot.moments["return"])
            return np.clip(rewards / np.sqrt(var[0] + 1e-8), -10, 10).astype(np.float32)
        return rewards

    def _algorithm(self, overrides: dict | None) -> LearnerAlgorithm | ReplayAlgorithm:
        algo_cfg = dataclasses.replace(self.cfg.algo, **overrides) if overrides \
            else self.cfg.algo
        algorithm = registry.build(algo_cfg)
        if not isinstance(algorithm, (LearnerAlgorithm, ReplayAlgorithm)):
            raise TypeError(f"algorithm {algo_cfg.name!r} is not trained by learners")
        return algorithm

    def update_transitions(self, snapshot: PolicySnapshot, transitions: Transitions, *,
                           lr: float, batch_size: int, seed: int) -> LearnerUpdate:
        """Gradient steps of a replay algorithm (:class:`ReplayAlgorithm`) from
        ``snapshot``, one per ``batch_size`` rows of ``transitions`` (drawn uniformly from the
        replay buffer by the driver, shuffled here), against the target network the snapshot
        carries; returns the parameter delta, as :meth:`update` does."""
        t0 = time.perf_counter()
        algorithm = self.algorithm
        if not isinstance(algorithm, ReplayAlgorithm):
            raise TypeError(f"algorithm {self.cfg.algo.name!r} does not learn from transitions")
        lcfg = self.cfg.learner
        model, flat, grad = self.model, self.flat, self.grad
        if self._peer is None:
            self._peer = self._make_model()
        target_params = snapshot.target_params if snapshot.target_params is not None \
            else snapshot.params
        load_snapshot(self._peer, PolicySnapshot(snapshot.version, target_params,
                                                 snapshot.moments))
        load_snapshot(model, snapshot)
        model.train()
        optimizer = self._optimizer(snapshot)
        # the rows arrive grouped by the worker and trajectory they were cut from: shuffled,
        # each gradient step's batch is a uniform sample of the buffer, not of one trajectory
        order = torch.randperm(len(transitions),
                               generator=torch.Generator().manual_seed(seed)).to(self.device)
        data = {name: torch.as_tensor(getattr(transitions, name), device=self.device)[order]
                for name in Transitions.FIELDS}
        steps_stats: list[dict] = []
        finite = True
        for start in range(0, len(transitions) - batch_size + 1, batch_size):
            batch = {k: v[start:start + batch_size] for k, v in data.items()}
            loss, stats = algorithm.loss(model, self._peer, batch)
            grad.zero_()
            loss.backward()
            if not (torch.isfinite(loss) and clipped_and_finite(grad, lcfg.max_grad_norm)):
                finite = False
                break
            with torch.no_grad():
                optimizer.step(flat, grad, lr)
            steps_stats.append(stats)
        delta = snapshot.params - flat.detach().cpu().numpy()
        stats = {k: float(np.mean([s[k] for s in steps_stats])) for k in steps_stats[0]} \
            if steps_stats else {}
        stats.update({"learner/finite": finite, "learner/epochs": len(steps_stats),
                      "learner/samples": len(transitions), "learner/lr": lr,
                      "learner/batch": batch_size,
                      "learner/time_s": time.perf_counter() - t0,
                      "learner/update_norm": float(np.linalg.norm(delta)),
                      "learner/adam_steps": int(optimizer.t)})
        opt_state = self._opt_state_out(optimizer, finite)
        return LearnerUpdate(delta=delta.astype(np.float32, copy=False),
                             version=snapshot.version, stats=stats, opt_state=opt_state)

    def update(self, snapshot: PolicySnapshot, traj: Trajectory, *, lr: float,
               seed: int, exchange: Exchange | None = None,
               algo_overrides: dict | None = None) -> LearnerUpdate:
        """Local epochs on ``traj`` from ``snapshot``; returns the parameter delta.

        ``exchange`` turns on Stellaris' global importance-sampling truncation: before each
        epoch the learner hands it its current local parameters and gets back the current
        parameters of the other learners computing now (the parameter actor keeps them), and
        measures each of their policies on the batch (one forward pass per other learner per
        epoch). Approximations, for cost: "current" is as of the other learner's last epoch
        start, and their policies are evaluated with this learner's observation statistics
        (those of the version it pulled). ``algo_overrides`` replaces algorithm
        hyperparameters for this update (population-based training gives each member its
        own).
        """
        t0 = time.perf_counter()
        lcfg = self.cfg.learner
        algorithm = self._algorithm(algo_overrides) if algo_overrides else self.algorithm
        model, flat, grad = self.model, self.flat, self.grad
        target_logp = None
        if algorithm.needs.target_network_every is not None:
            target_logp = self._target_logp(snapshot, traj)
        load_snapshot(model, snapshot)
        batch = algorithm.prepare(traj, model, device=self.device,
                                  rewards=self.rewards(traj, snapshot), target_logp=target_logp)
        model.train()
        optimizer = self._optimizer(snapshot)
        generator = torch.Generator().manual_seed(seed)
        size = len(batch)
        mb_size = size // lcfg.minibatches
        epoch_stats: list[dict] = []
        epochs_run = 0
        finite = True
        cross = CrossStats()
        # Stellaris' truncation reaches the loss as a per-sample weight function
        weights = {} if exchange is None else {"sample_weight": GlobalTruncation(lcfg.is_rho)}
        for _ in range(lcfg.epochs):
            if exchange is not None:
                batch.cross_ratio_min = self._exchange(exchange, batch, snapshot, cross)
            perm = torch.randperm(size, generator=generator).to(self.device)
            epoch_stats = []
            for k in range(lcfg.minibatches):
                mb = batch.take(perm[k * mb_size:(k + 1) * mb_size])
                loss, stats = algorithm.loss(model, mb, **weights)
                if not torch.isfinite(loss):
                    finite = False
                    break
                grad.zero_()
                loss.backward()
                if not clipped_and_finite(grad, lcfg.max_grad_norm):
                    finite = False
                    break
                with torch.no_grad():
                    optimizer.step(flat, grad, lr)
                epoch_stats.append(stats)
            epochs_run += 1
            if not finite or algorithm.stop_epochs(epoch_stats):
                break
        delta = snapshot.params - flat.detach().cpu().numpy()
        stats = {k: float(np.mean([s[k] for s in epoch_stats])) for k in epoch_stats[0]} \
            if epoch_stats else {}
        stats["learner/finite"] = finite
        stats.update(_explained_variance(batch))
        stats["learner/epochs"] = epochs_run
        stats["learner/samples"] = size
        stats["learner/time_s"] = time.perf_counter() - t0
        stats["learner/update_norm"] = float(np.linalg.norm(delta))
        stats["learner/adam_steps"] = int(optimizer.t)  # the moments' age, counted in steps
        if exchange is not None:
            stats.update(cross.record())
        opt_state = self._opt_state_out(optimizer, finite)
        return LearnerUpdate(delta=delta.astype(np.float32, copy=False),
                             version=snapshot.version, stats=stats, opt_state=opt_state)

    @torch.no_grad()
    def _target_logp(self, snapshot: PolicySnapshot, traj: Trajectory) -> np.ndarray | None:
        """log pi_target(a|s) of the batch's actions, if the actor keeps a target network:
        its parameters under the observation statistics it was taken with."""
        if snapshot.target_params is None:
            return None
        moments = snapshot.target_moments if snapshot.target_moments is not None \
            else snapshot.moments
        load_snapshot(self.model, PolicySnapshot(snapshot.version, snapshot.target_params,
                                                 moments))
        obs = torch.as_tensor(traj.obs, device=self.device)
        actions = torch.as_tensor(traj.actions, device=self.device)
        n = traj.num_steps * traj.num_envs
        dist = self.model.policy(obs.reshape(n, *obs.shape[2:]))
        return dist.log_prob(actions.reshape(n, *actions.shape[2:])).cpu().numpy()

    @torch.no_grad()
    def _exchange(self, exchange: Exchange, batch: Batch, snapshot: PolicySnapshot,
                  cross: "CrossStats") -> torch.Tensor | None:
        """Publish this learner's current parameters, get the others', and measure them."""
        t0 = time.perf_counter()
        # a copy: in-process the actor keeps the array, and this buffer goes on changing
        others = exchange(self.flat.detach().cpu().numpy().copy())
        cross.exchanges += 1
        cross.bytes += self.flat.numel() * 4 * (1 + len(others))
        cross.exchange_s += time.perf_counter() - t0
        cross.policies = max(cross.policies, len(others))
        if not others:
            return None
        t1 = time.perf_counter()
        ratio_min = self._cross_ratio_min(batch, others, snapshot.moments)
        cross.forward_passes += len(others)
        cross.forward_s += time.perf_counter() - t1
        return ratio_min

    @torch.no_grad()
    def _cross_ratio_min(self, batch: Batch, params: list[np.ndarray],
                         moments: dict | None = None) -> torch.Tensor:
        """``min_i pi_theta_i(a|s) / D(a|s)`` over other learners' parameters, with ``D`` the
        denominator of the algorithm's own ratio (the behaviour policy for PPO)."""
        if self._peer is None:
            self._peer = self._make_model()
        ratios = []
        for flat in params:
            load_snapshot(self._peer, PolicySnapshot(-1, flat, moments))
            dist = self._peer.policy(batch.obs)
            ratios.append((dist.log_prob(batch.actions) - batch.denominator_logp).exp())
        return torch.stack(ratios).min(0).values


@dataclasses.dataclass
class CrossStats:
    """The cost of the truncation's exchange, for the learner's statistics."""

    exchanges: int = 0
    policies: int = 0          # most other learners seen at once
    bytes: int = 0             # parameters sent and received
    exchange_s: float = 0.0
    forward_passes: int = 0    # batch forward passes under other learners' policies
    forward_s: float = 0.0

    def record(self) -> dict:
        return {"learner/cross_exchanges": self.exchanges,
                "learner/cross_policies": self.policies, "learner/cross_bytes": self.bytes,
                "learner/cross_exchange_s": self.exchange_s,
                "learner/cross_forward_passes": self.forward_passes,
                "learner/cross_forward_s": self.forward_s}


def clipped_and_finite(grad: torch.Tensor, max_norm: float) -> bool:
    """Clip a flat gradient to global norm ``max_norm`` (if > 0) and say whether every entry
    is finite: the norm is finite when they all are, so one reduction does both (a gradient
    so large that its norm overflows counts as non-finite; neither is ever applied)."""
    if max_norm > 0:
        return math.isfinite(clip_grad_norm(grad, max_norm))
    return bool(torch.isfinite(grad).all())


def clip_grad_norm(grad: torch.Tensor, max_norm: float) -> float:
    """Scale a flat gradient to global norm ``max_norm`` if larger (as clip_grad_norm_)."""
    norm = float(grad.norm())
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        grad.mul_(coef)
    return norm


def _explained_variance(batch: Batch) -> dict:
    y_true = batch.returns
    var = y_true.var()
    if var == 0:
        return {"losses/explained_variance": float("nan")}
    ev = 1 - (y_true - batch.values).var() / var
    return {"losses/explained_variance": float(ev)}
