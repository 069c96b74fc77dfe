"""Small decisions a trainer takes as it goes: learning rate, learner seeds, evaluations."""

from __future__ import annotations

import math

import numpy as np

RECENT_EPISODES = 20   # episodes in the "recent return" the progress bar and the target use
MIN_LR_FRACTION = 0.01


def learning_rate(lr: float, *, anneal: bool, env_steps: int, total_env_steps: int) -> float:
    """``lr``, or with ``anneal`` decayed linearly over the budget (CleanRL's schedule), to at
    least 1% of it so that learners launched at the very end still move."""
    if not anneal:
        return lr
    return lr * max(1.0 - env_steps / total_env_steps, MIN_LR_FRACTION)


def learner_seed(run_seed: int, sequence: int) -> int:
    """A reproducible, well-mixed seed for the ``sequence``-th learner task of a run."""
    return int(np.random.SeedSequence([run_seed, 1, sequence]).generate_state(1)[0])


CONFIRM_FACTOR = 3   # a confirmation's default length, in the env's standard evaluations


def target_confirmed(*, mean: float, std: float, episodes: int, target: float,
                     margin: float, standard_episodes: int) -> bool:
    """Whether a confirming evaluation predicts that a fresh evaluation by the env's standard
    (``standard_episodes`` episodes, e.g. Gym's 100 for CartPole) reaches the target:
    ``mean - margin * std * sqrt(1 / episodes + 1 / standard_episodes) >= target``, the
    standard error being that of the gap between the two means (independent episodes, one
    spread). ``margin`` 0 is the bare standard, which a policy just at the target passes half
    the time. Why this form, three times the standard's episodes and a margin of 3.5:
    ``docs/decisions/confirmation-rule.md``.
    """
    gap = std * math.sqrt(1.0 / max(episodes, 1) + 1.0 / max(standard_episodes, 1))
    return mean - margin * gap >= target


class EvalSchedule:
    """When to run a greedy evaluation.

    Every ``every_updates`` updates (0: never periodically), and whenever the recent training
    return reaches the target (over at least 5 episodes), at most once per update count and
    one at a time. After a target that was not confirmed, the recent return alone triggers no
    evaluation for ``max(every_updates, 1)`` updates (it is likely still at the target).
    """

    def __init__(self, *, every_updates: int, target: float | None):
        self.every_updates = every_updates
        self.target = target
        self.last_updates = -1
        self.target_held_until = -1

    def due(self, *, updates: int, recent_return: float | None, recent_episodes: int,
            running: bool) -> bool:
        """Whether to start an evaluation now (it is then counted as started)."""
        if running or updates == self.last_updates:
            return False
        periodic = (self.every_updates > 0
                    and updates - max(self.last_updates, 0) >= self.every_updates)
        at_target = (self.target is not None and recent_return is not None
                     and updates >= self.target_held_until
                     and recent_episodes >= min(RECENT_EPISODES, 5)
                     and recent_return >= self.target)
        if periodic or at_target:
            self.last_updates = updates
            return True
        return False

    def hold_target(self, updates: int) -> None:
        """A target was not confirmed at ``updates``: no evaluation on the recent return alone
        for a while."""
        self.target_held_until = updates + max(self.every_updates, 1)

    def state(self) -> dict[str, int]:
        """What a checkpoint keeps, so that a resumed run evaluates when this one would have."""
        return {"eval_last_updates": self.last_updates,
                "eval_target_held_until": self.target_held_until}

    def load_state(self, d: dict) -> None:
        """The inverse of :meth:`state`; a checkpoint without it evaluates at the next update."""
        self.last_updates = int(d.get("eval_last_updates", -1))
        self.target_held_until = int(d.get("eval_target_held_until", -1))

    def reset(self) -> None:
        """After a recovery the version may repeat: evaluate it again."""
        self.last_updates = -1
