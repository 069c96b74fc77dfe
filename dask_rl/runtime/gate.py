"""The evaluation gate: greedy screenings, the confirmation that calls a run solved, its verdict.

A greedy evaluation that reaches the target is a *screening*, not a verdict. A run is called
solved only when a *confirming* evaluation of the policy it keeps — ``stop.confirm_episodes``
fresh episodes, three times the env's standard (Gym defines solving a classic-control task by
a mean over 100 episodes), on seeds no screening uses — predicts that a fresh evaluation by the
standard reaches it too, by ``stop.confirm_margin`` standard errors
(:func:`~dask_rl.control.schedule.target_confirmed`). Each stop on a target is a test repeated
over a run, and a short evaluation passes by luck often enough to matter
(``docs/decisions/confirmation-rule.md``).

:class:`EvaluationGate` keeps the verdict's state (the counters a checkpoint carries, the last
screening, the confirmation) for every driver; the asynchronous driver's evaluation tasks are
:class:`~dask_rl.runtime.evaluations.EvaluationTasks`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from dask_rl.control.schedule import CONFIRM_FACTOR, target_confirmed
from dask_rl.data import Evaluation
from dask_rl.envs import reward_threshold, solved_episodes

logger = logging.getLogger(__name__)

SCREEN_SEEDS = 10_000              # a screening's seeds: this plus the evaluation's number
CONFIRM_SEEDS = 1_000_000_000      # a confirmation's: a range no screening or rollout uses


class EvaluationGate:
    """What a run's evaluations said, and whether they call it solved."""

    def __init__(self, run: Any):   # the Run whose evaluations these are
        cfg = run.cfg
        self.run = run
        self.target = (cfg.stop.target_return if cfg.stop.target_return is not None
                       else reward_threshold(cfg.env))
        self.standard_episodes = solved_episodes(cfg.env)
        self.confirm_episodes = (cfg.stop.confirm_episodes if cfg.stop.confirm_episodes
                                 is not None else CONFIRM_FACTOR * self.standard_episodes)
        self.evals = 0                        # checkpointed, so seeds never repeat
        self.best_return: float | None = None  # checkpointed
        self.last_eval: Evaluation | None = None
        self.target_hit = False               # a screening reached the target: confirm it
        self.confirmation: Evaluation | None = None   # the confirming evaluation, if any
        self.screenings: list[float] = []     # screening returns in order (sweeps prune on them)

    def screen_seed(self) -> int:
        return SCREEN_SEEDS + self.evals

    def confirm_seed(self) -> int:
        return CONFIRM_SEEDS + 1_000 * self.evals

    def screened(self, result: Evaluation) -> None:
        """A screening came back: log it; reaching the target asks for a confirmation
        (:attr:`target_hit`), which the driver runs when its policy is still."""
        self._log(result, "screening")
        run = self.run
        if (run.cfg.stop.solve_on_target and self.target is not None
                and result.mean_return >= self.target and run.stop_reason is None):
            self.target_hit = True

    def confirmed(self, result: Evaluation) -> bool:
        """A confirmation came back: the run is solved (and stops) if it clears the target;
        otherwise training goes on. Returns whether it was confirmed."""
        self.target_hit = False
        self.confirmation = result
        self._log(result, "confirmation")
        confirmed = self.clears_target(result)
        if confirmed and self.run.stop_reason is None:
            self.run.stop_reason = "solved"
        elif not confirmed:
            logger.info("the target was not confirmed: %.1f +- %.1f over %d episodes",
                        result.mean_return, result.std_return, result.episodes)
        return confirmed

    def clears_target(self, result: Evaluation) -> bool:
        return self.target is not None and target_confirmed(
            mean=result.mean_return, std=result.std_return, episodes=result.episodes,
            target=self.target, margin=self.run.cfg.stop.confirm_margin,
            standard_episodes=self.standard_episodes)

    def solved(self) -> bool:
        """Whether a confirming evaluation of the final policy cleared the target."""
        return self.confirmation is not None and self.clears_target(self.confirmation)

    def policy_lost(self) -> None:
        """The actor rolled back to an older checkpoint: the policy that reached the target, or
        was confirmed, is gone (the run's end judges the policy it now holds)."""
        self.target_hit = False
        if self.confirmation is not None:
            logger.warning("the confirmed policy (version %d) was lost with the parameter "
                           "actor; the final policy will be judged again",
                           self.confirmation.version)
            self.confirmation = None

    def final(self, evaluate: Callable[[int, int], Evaluation]) -> Evaluation | None:
        """The evaluation the summary reports, of the final policy: the confirmation that
        solved the run (or, for an interrupted run, the last evaluation), or a new screening —
        followed by a confirmation when it reaches the target, so that ``solved`` is always
        judged on ``confirm_episodes`` fresh episodes, and then that confirmation (its
        ``confirm_episodes`` say more of the policy than the screening's few: PBT picks its
        best member by it). ``evaluate(episodes, seed)``. None for an interrupted run that has
        no evaluation: none is started on a cluster that may be going."""
        run = self.run
        if run.stop_reason == "solved" and self.confirmation is not None:
            return self.confirmation
        self.confirmation = None  # one of an earlier policy says nothing of the final one
        if run.interrupted or (run.stop_reason in ("interrupted", "pruned")
                               and self.last_eval is not None):
            return self.last_eval
        result = evaluate(run.cfg.stop.eval_episodes, self.screen_seed() + 1)
        self._log(result, "screening")
        if self.target is not None and result.mean_return >= self.target:
            result = evaluate(self.confirm_episodes, self.confirm_seed())
            self.confirmed(result)
        return result

    def state(self) -> dict[str, Any]:
        return {"evals": self.evals, "best_return": self.best_return}

    def load_state(self, d: dict) -> None:
        self.evals = int(d["evals"])
        self.best_return = d.get("best_return")

    def _log(self, result: Evaluation, purpose: str) -> None:
        run = self.run
        self.last_eval = result
        if purpose == "screening":
            self.screenings.append(result.mean_return)
        ret = result.mean_return
        self.best_return = ret if self.best_return is None else max(self.best_return, ret)
        run.metrics.write("eval", {"env_steps": run.env_steps, "updates": run.updates,
                                   "wall_s": run.elapsed(), "purpose": purpose,
                                   **result.record()})
        logger.info("greedy %s at %d steps (version %d): %.1f over %d episodes", purpose,
                    run.env_steps, result.version, ret, result.episodes)
