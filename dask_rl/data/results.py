"""Typed results that cross task boundaries: policies, updates, acknowledgements, evaluations.

Everything here is plain data (numpy arrays, numbers, strings), cheap for Dask to size and
move. Records written to ``metrics.jsonl`` are made from these by their ``record`` methods,
so the file's keys stay those the dashboard and the plots read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PolicySnapshot:
    """One version of the policy as the parameter actor hands it out."""

    version: int
    params: np.ndarray                      # flat float32 parameters
    moments: dict | None = None             # running statistics {"obs": ..., "return": ...}
    opt_state: dict | None = None           # learners' Adam moments {"m", "v", "t"}
    target_params: np.ndarray | None = None  # the target network (Needs.target_network_every)
    target_moments: dict | None = None       # ... and the statistics it was taken with

    def __sizeof__(self) -> int:
        extra = sum(m.nbytes for m in (self.moments or {}).values())
        if self.opt_state is not None:
            extra += self.opt_state["m"].nbytes + self.opt_state["v"].nbytes
        if self.target_params is not None:
            extra += self.target_params.nbytes
        if self.target_moments is not None and self.target_moments is not self.moments:
            extra += sum(m.nbytes for m in self.target_moments.values())
        return self.params.nbytes + extra + 128


@dataclass
class LearnerUpdate:
    """What a learner found on one batch, pushed to the parameter actor.

    ``delta = theta_pulled - theta_local`` is the parameter change of the learner's local
    epochs; the aggregation strategies call it a *gradient*, as the papers do, and the actor
    applies ``theta -= alpha0 * sum_j w_j delta_j``.
    """

    delta: np.ndarray           # flat float32
    version: int                # parameter version the learner pulled
    stats: dict[str, Any] = field(default_factory=dict)   # losses/..., learner/...
    opt_state: dict | None = None  # the local Adam moments after the update

    @property
    def finite(self) -> bool:
        return bool(self.stats.get("learner/finite", True))

    def __sizeof__(self) -> int:
        extra = 0 if self.opt_state is None else 2 * self.delta.nbytes
        return self.delta.nbytes + extra + 512


@dataclass(frozen=True)
class PushAck:
    """What became of a push: ``applied``, ``buffered``, ``dropped`` or ``rejected``."""

    status: str
    version: int        # the actor's version after the push
    staleness: int = 0  # version at arrival minus the version the learner pulled
    weight: float | None = None  # its weight in the update, when applied at its arrival


@dataclass
class LearnerReport:
    """What a learner task returns to the driver: a few numbers, never the data."""

    ack: PushAck
    version_pulled: int
    policy_lag: int               # version pulled minus the version that acted
    episode_returns: list[float]  # episodes that ended in the trajectory
    episode_lengths: list[int]
    trajectory_steps: int
    trajectory_bytes: int
    collect_s: float              # seconds the rollout took
    pull_s: float
    push_s: float
    task_s: float
    cross_policies: int           # other learners' policies used for IS truncation
    worker: str
    stats: dict[str, Any] = field(default_factory=dict)  # the learner's losses/ and learner/
    rollout_pull_s: float = 0.0   # seconds the rollout task pulled the policy before collecting
    slot_wait_s: float = 0.0      # seconds the rollout waited for its slot's environments

    def record(self) -> dict[str, Any]:
        """The flat metrics record of this report (without the episode lists)."""
        return {**self.stats, "status": self.ack.status, "staleness": self.ack.staleness,
                "weight": self.ack.weight,
                "version_after": self.ack.version, "version_pulled": self.version_pulled,
                "policy_lag": self.policy_lag, "trajectory_steps": self.trajectory_steps,
                "trajectory_bytes": self.trajectory_bytes, "rollout/collect_s": self.collect_s,
                "rollout/pull_s": self.rollout_pull_s, "rollout/slot_wait_s": self.slot_wait_s,
                "learner/pull_s": self.pull_s, "learner/push_s": self.push_s,
                "learner/task_s": self.task_s, "cross_policies": self.cross_policies,
                "worker": self.worker}


@dataclass
class TrajectoryStats:
    """A finished rollout's counts, for a run whose learners sample a replay buffer (the
    trajectory itself stays on its worker)."""

    env_steps: int
    steps: int
    envs: int
    episode_returns: list[float]
    episode_lengths: list[int]
    policy_version: int
    nbytes: int
    collect_s: float


@dataclass(frozen=True)
class Evaluation:
    """A greedy (or, for ES, noiseless) evaluation of one policy version."""

    mean_return: float
    std_return: float
    min_return: float
    max_return: float
    mean_length: float
    episodes: int
    version: int
    env_steps: int | None = None   # steps the evaluation took (ES reports them)

    @classmethod
    def of(cls, returns: list[float] | np.ndarray, lengths: list[int] | np.ndarray, *,
           version: int, env_steps: int | None = None) -> "Evaluation":
        r = np.asarray(returns, np.float64)
        return cls(mean_return=float(r.mean()), std_return=float(r.std()),
                   min_return=float(r.min()), max_return=float(r.max()),
                   mean_length=float(np.mean(lengths)), episodes=int(r.size), version=version,
                   env_steps=env_steps)

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class PerturbationResult:
    """One ES task's evaluations: returns and lengths ``[n, 2]`` (plus, minus) per pair."""

    returns: np.ndarray
    lengths: np.ndarray
    moments: np.ndarray | None  # observation statistics seen, if observations are normalised


@dataclass(frozen=True)
class ESStep:
    """The ES update's fate and the norm of the gradient estimate it applied."""

    ack: PushAck
    grad_norm: float


@dataclass(frozen=True)
class Progress:
    """What a run reports as it goes (the CLI draws its progress bar from it)."""

    env_steps: int
    total: int
    recent_return: float | None
    updates: int
    steps_per_s: float
    eval_return: float | None = None
    dashboard: str | None = None
    screenings: tuple[float, ...] = ()   # every screening evaluation's return so far, in order
