"""What a finished run reports: ``summary.json``, as typed records.

Every run's summary starts with :class:`RunSummary` (the keys DESIGN.md promises); trainers
with a parameter actor add :class:`TrainerSummary`'s, and each driver its own
(:class:`LearnerSummary` for the asynchronous learners, :class:`ESSummary`,
:class:`PBTSummary`). ``summary.json`` is :meth:`RunSummary.to_dict`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunSummary:
    algorithm: str
    env_id: str
    env_steps: int
    updates: int
    wall_s: float
    final_return: float          # greedy evaluation mean of the final policy
    best_return: float | None    # the best greedy evaluation mean seen
    target_return: float | None
    solved: bool                 # a confirming evaluation of the final policy reached it
    confirmation: dict | None    # that evaluation (stop.confirm_episodes fresh episodes)
    stop_reason: str | None      # solved, env_steps, wall_s, members_done
    staleness_mean: float
    staleness_max: int
    recoveries: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TrainerSummary(RunSummary):
    """A trainer with a parameter actor."""

    run: str
    steps_per_s: float
    final_return_std: float
    staleness_histogram: list[int]
    gradients_applied: int
    gradients_dropped: int
    gradients_rejected: int
    step_per_gradient: float | None   # alpha0 x the mean weight of an applied gradient
    pushes_refused: int          # repeats, other epochs' or runs' pushes: never applied
    env_steps_discarded: int     # learned from, then lost when a recovery rolled back
    updates_discarded: int       # applied, then lost when a recovery rolled back
    replay_lost: int             # replay-buffer trajectories a recovery threw away
    episodes: int
    actor_apply_share: float     # the actor's gating and applying, a share of wall time
    worker_threads: int


@dataclass
class LearnerSummary(TrainerSummary):
    """Asynchronous learners (PPO, IMPACT, ...): where every trajectory and second went."""

    strategy: str
    rollout_slots: int
    env_steps_collected: int
    trajectories_produced: int   # == trajectories_consumed + dropped_trajectories
    trajectories_consumed: int
    dropped_trajectories: int
    cancelled_rollouts: int
    trajectory_bytes: int
    learner_time_share: float
    rollout_time_share: float
    rollout_pulls: int           # rollout slots' pulls asked of the actor (event triggers) ...
    rollout_loads: int           # ... and those answered with parameters
    channel_trips: int | None = None  # trips the last actor served over its direct channel


@dataclass
class ESSummary(TrainerSummary):
    generations: int
    population: int
    pairs_per_task: int


@dataclass
class MemberSummary:
    """One member of a population-based training run."""

    member: int
    final_return: float
    best_return: float | None
    env_steps: int
    hparams: dict[str, float]
    first_score: float | None
    exploits: int
    run_dir: str


@dataclass
class PBTSummary(RunSummary):
    best_member: int
    initial_worst_return: float | None
    exploits: int
    members: list[MemberSummary] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
