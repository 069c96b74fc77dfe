"""The asynchronous driver's rollout tasks: one per slot at a time, each collecting one
trajectory with the policy it pulls, which stays on its worker (the driver holds its future).

A replay algorithm's trajectories go into the worker-resident replay buffer
(:class:`~dask_rl.runtime.sampled.SampledReplay`), where a small task counts their env steps
and episodes; an on-policy algorithm's wait in the launch policy for a learner, which reports
them when it learns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from distributed import Future

from dask_rl.runtime.tasks import rollout_task


class RolloutTasks:
    """Submits the driver's rollouts and takes their trajectories and losses."""

    def __init__(self, driver: Any):   # the Driver
        self.driver = driver
        self.seq = 0   # checkpointed, so task keys never repeat

    def submit(self, slot: int) -> None:
        d = self.driver
        self.seq += 1
        # replay algorithms act as they explore (DQN: epsilon-greedy on its action values)
        exploration = (d.algorithm.exploration(d.accounting.env_steps_collected)
                       if d.sampled is not None else None)
        fut = d.client.submit(rollout_task, d.run_name, slot, d.actor, exploration,
                              pure=False, key=f"rollout-{slot}-{self.seq}-{d.run_name}",
                              **d.follower.placement(slot))
        d.inflight.hold(fut, "rollout", self.done, lost=self.lost, fetch=False, slot=slot)

    def done(self, trajectory: Future, task: Any) -> None:
        d = self.driver
        d.accounting.rollout_finished(d.cfg.batch_size)
        d.policy.rollout_done(task.slot, trajectory)
        d.learners.collected(task.slot, trajectory)
        if d.sampled is not None:
            # counted where it lies; a failed count leaves its steps uncounted (the buffer
            # keeps the trajectory)
            d.inflight.hold(d.sampled.stored(trajectory), "stats", self.counted, at_end="wait")
            d.replay_changed()

    def lost(self, task: Any) -> None:
        self.driver.policy.rollout_failed(task.slot)
        self.driver.learners.slot_lost(task.slot)

    def counted(self, stats: Any, task: Any) -> None:
        """A sampled run's rollout counted where it lies: its env steps and episodes."""
        d = self.driver
        d.env_steps += stats.env_steps
        d.returns.extend(stats.episode_returns)
        d.episodes += len(stats.episode_returns)
        d.metrics.write("rollout", {
            "env_steps": d.env_steps, "wall_s": d.elapsed(),
            "charts/episodic_return": float(np.mean(stats.episode_returns))
            if stats.episode_returns else None,
            "charts/episodic_length": float(np.mean(stats.episode_lengths))
            if stats.episode_lengths else None,
            "charts/return_recent": d.recent_return(), "episodes": d.episodes,
            "rollout/policy_version": stats.policy_version,
            "rollout/collect_s": stats.collect_s})
        d.report_progress()
