"""Where every trajectory and every second went, in an asynchronous run.

Every trajectory a rollout produces is either learned from (consumed) or deliberately dropped
(ready when the run stopped, or its learner was lost or cancelled), and the summary shows both,
so ``produced == consumed + dropped`` holds at the end of a run (checked by the tests). Env
steps are counted twice on purpose: ``env_steps_collected`` when a rollout finishes (what the
environments did) and ``env_steps`` when a trajectory is first learned from (what training
used; the budget counts these).
"""

from __future__ import annotations

from dataclasses import dataclass


def ema(previous: float, value: float, weight: float = 0.2) -> float:
    """An exponential moving average that starts at the first value."""
    return value if previous == 0.0 else (1 - weight) * previous + weight * value


@dataclass
class Accounting:
    """Counters of one asynchronous trainer (reported in ``summary.json``)."""

    env_steps_collected: int = 0
    trajectories_produced: int = 0
    trajectories_consumed: int = 0
    dropped_trajectories: int = 0
    cancelled_rollouts: int = 0
    trajectory_bytes: int = 0
    learner_busy_s: float = 0.0
    rollout_busy_s: float = 0.0
    rollout_s: float = 0.0   # moving averages of task durations, for the adaptive policy
    learner_s: float = 0.0
    # ... and of the driver's cycle per task, submission to result: what a slot really yields
    # (scheduling, transfers, waiting for a thread included; TianJi's allocation uses these)
    rollout_cycle_s: float = 0.0
    learner_cycle_s: float = 0.0

    def cycle(self, kind: str, seconds: float) -> None:
        """A rollout or learner task came back ``seconds`` after it was submitted."""
        if kind == "rollout":
            self.rollout_cycle_s = ema(self.rollout_cycle_s, seconds)
        elif kind == "learner":
            self.learner_cycle_s = ema(self.learner_cycle_s, seconds)

    def rollout_finished(self, env_steps: int) -> None:
        self.trajectories_produced += 1
        self.env_steps_collected += env_steps

    def learner_finished(self, *, first_use: bool, task_s: float, collect_s: float,
                         trajectory_bytes: int) -> None:
        """A learner's result came back; a replay counts its time but not its data again."""
        self.learner_busy_s += task_s
        self.learner_s = ema(self.learner_s, task_s)
        self.rollout_s = ema(self.rollout_s, collect_s)
        if first_use:
            self.trajectories_consumed += 1
            self.rollout_busy_s += collect_s
            self.trajectory_bytes += trajectory_bytes

    def dropped(self, trajectories: int = 0, rollouts: int = 0) -> None:
        self.dropped_trajectories += trajectories
        self.cancelled_rollouts += rollouts
