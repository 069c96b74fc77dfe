"""A trainer's evaluation tasks: screenings on a schedule, the confirmation that holds the
policy still, and the evaluations the run's end waits for.

Their results go to the run's :class:`~dask_rl.runtime.gate.EvaluationGate`. A screening runs
beside training; on reaching the target the launch policy pauses (nothing new starts, learners
in flight finish), the still policy is confirmed, and the run stops solved with exactly that
policy or trains on (the recent return alone then triggers no screening for a while).

The ES driver submits its evaluations through this part too (the task is the trainer's
``evaluation_task``: ES plays its mean parameters without noise); its generations are
synchronous, so it gathers its screenings itself and confirms between generations.
"""

from __future__ import annotations

from typing import Any

from distributed import Future

from dask_rl.control.schedule import EvalSchedule
from dask_rl.data import Evaluation
from dask_rl.runtime.run import Abandoned


class EvaluationTasks:
    """Submits the driver's evaluations and takes their results."""

    def __init__(self, driver: Any):
        self.driver = driver
        self.gate = driver.gate
        self.schedule = EvalSchedule(every_updates=driver.cfg.stop.eval_every_updates,
                                     target=self.gate.target)

    def maybe_screen(self) -> None:
        """A screening when the schedule says one is due (none while a target waits)."""
        d = self.driver
        if d.stop_reason is not None or self.gate.target_hit:
            return
        if self.schedule.due(updates=d.updates, recent_return=d.recent_return(),
                             recent_episodes=len(d.returns), running=d.inflight.running("eval")):
            self.submit("eval")

    def maybe_confirm(self) -> None:
        """A screening reached the target: hold the policy still (nothing new starts; learners
        in flight finish) and confirm it on ``confirm_episodes`` fresh episodes."""
        d = self.driver
        if not self.gate.target_hit or d.stop_reason is not None:
            return
        d.policy.pause()
        if d.policy.learners_in_flight or d.inflight.running("confirm"):
            return
        self.submit("confirm", self.gate.confirm_episodes)

    def screened(self, result: Evaluation, _task) -> None:
        self.gate.screened(result)

    def confirmed(self, result: Evaluation, _task) -> None:
        d = self.driver
        if not self.gate.confirmed(result) and d.stop_reason is None:
            d.policy.resume()   # not confirmed: train on
            self.schedule.hold_target(d.updates)

    def submit(self, kind: str, episodes: int | None = None, seed: int | None = None, *,
               held: bool | None = None) -> Future:
        """An evaluation task of the trainer's ``evaluation_task``: a screening (``eval``) or a
        confirmation (``confirm``), both held in flight by the driver unless ``held`` is
        False (the caller gathers it), or with ``kind="final"`` one the caller waits for."""
        d, gate = self.driver, self.gate
        gate.evals += 1
        if seed is None:
            seed = gate.confirm_seed() if kind == "confirm" else gate.screen_seed()
        fut = d.client.submit(
            d.evaluation_task, d.run_name, d.actor,
            d.cfg.stop.eval_episodes if episodes is None else episodes, seed, pure=False,
            key=f"{'confirm' if kind == 'confirm' else 'evaluate'}-{gate.evals}-{d.run_name}")
        if held if held is not None else kind != "final":
            d.inflight.hold(fut, kind, self.confirmed if kind == "confirm" else self.screened,
                            at_end="keep")
        d.hooks.evaluation_submitted(d, fut)
        d.metrics.write("phase", {"phase": kind, "event": "start", "key": fut.key,
                                  "env_steps": d.env_steps, "updates": d.updates})
        return fut

    def now(self, episodes: int, seed: int, kind: str = "final") -> Evaluation:
        """An evaluation the caller waits for (the run's end; ES's confirmations, between its
        generations); a lost actor is re-created and the evaluation asked again."""
        d = self.driver
        while True:
            fut = self.submit(kind, episodes, seed, held=False)
            try:
                return d.wait_for(fut)
            except Abandoned:
                d.client.cancel([fut])
                raise
            except Exception as e:
                if d.supervisor.alive(timeout=min(5.0, d.cfg.checkpoint.actor_timeout_s)):
                    raise
                d.on_actor_lost(f"the final evaluation failed and the parameter actor is "
                                f"gone: {e!r}")
