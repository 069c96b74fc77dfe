"""The asynchronous driver's learner tasks: Stellaris' transient learners, one per trajectory
(or, for a replay algorithm, one per batch of gradient steps on the replay buffer).

A learner *fused* with its rollout (``learner.fused``, an on-policy algorithm without replay)
is one task that collects on a slot and learns from what it collected, where it collected it
(:func:`~dask_rl.runtime.tasks.collect_and_learn_task`). A slot's next task is submitted
before its running one ends and waits on the slot's worker, which goes straight on to it: no
trip to the driver lies between two tasks of a worker.

A learner task pulls the current parameters, computes its gradients where the trajectory lies
and pushes them to the parameter actor, whose strategy gates them; the driver gets back a small
:class:`~dask_rl.data.LearnerReport`. Under a synchronous strategy a round's learners are
announced before its rollouts start (:meth:`LearnerTasks.announce`), so that the barrier waits
for every one of them, even one whose trajectory is never collected; with replay (IMPACT's
buffer), each trajectory's replays are the round's learners too, announced with it, so that
an update averages a whole round, first uses and replays, all computed on the same version.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from distributed import Future

from dask_rl.control.launch import FusedLaunch
from dask_rl.control.schedule import learner_seed, learning_rate
from dask_rl.data import LearnerReport
from dask_rl.runtime.tasks import collect_and_learn_task, learner_task


class LearnerTasks:
    """Submits the driver's learners and takes their reports and losses."""

    def __init__(self, driver: Any):   # the Driver
        self.driver = driver
        self.seq = 0   # checkpointed, so task keys and seeds never repeat
        # synchronous rounds: the learner each slot's trajectory will get, announced up front
        self.round: dict[int, str] = {}
        self.of_trajectory: dict[Future, str] = {}
        # ... and the round's replay learners, announced with it, taken as replays start
        self.round_replays: list[str] = []

    def _next_id(self) -> str:
        self.seq += 1
        return f"L{self.seq}"

    def announce(self, slots: list[int]) -> None:
        """A synchronous round starts: one learner per slot and, with replay, its replays,
        announced to the actor."""
        d = self.driver
        if self.round_replays:  # replays the last round never started (a trajectory evicted)
            d.actor_call("release_learners", self.round_replays, on_loss="skip")
            self.round_replays = []
        for slot in slots:
            self.round[slot] = self._next_id()
        replays = d.replay.replay - 1 if d.replay is not None else 0
        self.round_replays = [self._next_id() for _ in range(replays * len(slots))]
        # skipped on loss: the recovery drops this round, a new one is announced
        d.actor_call("expect_learners", [self.round[s] for s in slots] + self.round_replays,
                     on_loss="skip")

    def collected(self, slot: int, trajectory: Future) -> None:
        """A round's trajectory came: the learner announced for its slot takes it."""
        if slot in self.round:
            self.of_trajectory[trajectory] = self.round.pop(slot)

    def slot_lost(self, slot: int) -> None:
        """A round's rollout failed: its learner, and its replays, will never come."""
        if slot in self.round:
            d = self.driver
            d.actor_call("learner_lost", self.round.pop(slot), on_loss="skip")
            replays = d.replay.replay - 1 if d.replay is not None else 0
            gone, self.round_replays = (self.round_replays[:replays],
                                        self.round_replays[replays:])
            if gone:
                d.actor_call("release_learners", gone, on_loss="skip")

    def clear(self) -> None:
        """The actor was replaced: every announced round is gone with it."""
        self.round.clear()
        self.of_trajectory.clear()
        self.round_replays = []

    def learner_id(self, trajectory: Any, first_use: bool) -> str:
        """The id of the learner about to start on ``trajectory``: the one announced for its
        round (a replay takes one of the round's replay ids), or a new one."""
        if first_use:
            lid = self.of_trajectory.pop(trajectory, None)
        else:
            lid = self.round_replays.pop(0) if self.round_replays else None
        return lid or self._next_id()

    def fused_learner_id(self, slot: int) -> str:
        """The id of the fused learner about to start on ``slot``."""
        return self.round.pop(slot, None) or self._next_id()

    def learning_rate(self) -> float:
        d = self.driver
        cfg = d.cfg.learner
        return learning_rate(d.hparams.get("learner.lr", cfg.lr), anneal=cfg.anneal_lr,
                             env_steps=d.env_steps, total_env_steps=d.cfg.stop.env_steps)

    def _algo_overrides(self) -> dict | None:
        return {k.split(".", 1)[1]: v for k, v in self.driver.hparams.items()
                if k.startswith("algo.")} or None

    def submit_fused(self, launch: FusedLaunch) -> None:
        """A learner fed where its data is: it collects on ``launch.slot`` and learns from
        that trajectory there; a queued launch waits on the slot's worker."""
        d = self.driver
        lid = self.fused_learner_id(launch.slot)
        seq = int(lid[1:])
        fut = d.client.submit(collect_and_learn_task, d.run_name, launch.slot, d.actor, lid,
                              self.learning_rate(), learner_seed(d.cfg.seed, seq),
                              self._algo_overrides(), seq, pure=False,
                              key=f"learner-{lid}-{d.run_name}",
                              **d.follower.placement(launch.slot))
        d.metrics.write("phase", {"phase": "learner", "event": "start", "learner": lid,
                                  "first_use": True, "slot": launch.slot})
        d.inflight.hold(fut, "learner", self.fused_done, lost=self.fused_lost, at_end="wait",
                        slot=launch.slot, learner_id=lid, concurrent=launch.concurrent)

    def fused_done(self, report: LearnerReport, task: Any) -> None:
        d = self.driver
        d.accounting.rollout_finished(report.trajectory_steps)
        steps_per_s = self._learned(report, task)
        if d.policy.fused_done(task.slot):
            self._end_round()
        d.report_progress(steps_per_s=steps_per_s)

    def fused_lost(self, task: Any) -> None:
        d = self.driver
        d.policy.fused_failed(task.slot)
        d.actor_call("learner_lost", task.learner_id, on_loss="skip")
        d.accounting.dropped(rollouts=1)

    def submit(self, trajectory: Future | None, first_use: bool, concurrent: int) -> None:
        """A learner on ``trajectory`` (its first use, or a replay of it), or with None a
        sampled learner on the replay buffer."""
        d = self.driver
        cfg = d.cfg.learner
        lid = self.learner_id(trajectory, first_use)
        seq = int(lid[1:])
        kwargs = {"resources": {"GPU": cfg.gpus}} if cfg.gpus > 0 else {}
        seed = learner_seed(d.cfg.seed, seq)
        if trajectory is None:  # a sampled learner (value-based, on the replay buffer)
            fut, record = d.sampled.submit_learner(d.actor, lid, self.learning_rate(), seed,
                                                   seq, **kwargs)
            d.metrics.write("replay", {"env_steps": d.env_steps, "learner": lid, **record})
            first_use = False
        else:
            fut = d.client.submit(learner_task, d.run_name, trajectory, d.actor, lid,
                                  self.learning_rate(), seed, self._algo_overrides(),
                                  first_use, seq, pure=False, key=f"learner-{lid}-{d.run_name}",
                                  **kwargs)
        d.metrics.write("phase", {"phase": "learner", "event": "start", "learner": lid,
                                  "first_use": first_use})
        d.inflight.hold(fut, "learner", self.done, lost=self.lost, at_end="wait",
                        learner_id=lid, first_use=first_use, concurrent=concurrent)

    def done(self, report: LearnerReport, task: Any) -> None:
        d = self.driver
        steps_per_s = self._learned(report, task)
        if d.sampled is not None:
            d.sampled.learner_done(int(report.stats.get("learner/epochs", 0))
                                   * int(report.stats.get("learner/batch", 0)))
            d.replay_changed()
        if d.policy.learner_done(task.first_use):
            self._end_round()
        d.report_progress(steps_per_s=steps_per_s)

    def _learned(self, report: LearnerReport, task: Any) -> float:
        """What every learner's report changes: counters, returns, its metrics record; the
        training's env steps per second."""
        d = self.driver
        first_use = task.first_use
        d.updates = max(d.updates, report.ack.version)
        d.accounting.learner_finished(first_use=first_use, task_s=report.task_s,
                                      collect_s=report.collect_s,
                                      trajectory_bytes=report.trajectory_bytes)
        returns, lengths = report.episode_returns, report.episode_lengths
        if first_use:  # a replay learns from the same steps and episodes again
            d.env_steps += report.trajectory_steps
            d.returns.extend(returns)
            d.episodes += len(returns)
        else:
            returns, lengths = [], []
        steps_per_s = d.steps_per_s(d.accounting.env_steps_collected)
        d.metrics.write("learner", {
            "env_steps": d.env_steps,
            "env_steps_collected": d.accounting.env_steps_collected,
            "updates": d.updates, "wall_s": d.elapsed(), "steps_per_s": steps_per_s,
            "charts/episodic_return": float(np.mean(returns)) if returns else None,
            "charts/episodic_length": float(np.mean(lengths)) if lengths else None,
            "charts/return_recent": d.recent_return(), "episodes": d.episodes,
            "charts/learning_rate": self.learning_rate(), **report.record(),
            "replay": not first_use, "learners/in_flight": task.concurrent,
            "learner": task.learner_id})
        return steps_per_s

    def lost(self, task: Any) -> None:
        d = self.driver
        d.policy.learner_failed(task.first_use)
        d.actor_call("learner_lost", task.learner_id, on_loss="skip")
        d.accounting.dropped(trajectories=int(task.first_use))

    def _end_round(self) -> None:
        """A round: one trajectory per rollout slot learned. The strategy may adapt to it."""
        d = self.driver
        reward = d.recent_return()
        m = d.actor_call("round_end", **({"reward": reward} if reward is not None else {}))
        d.metrics.write("round", {"env_steps": d.env_steps, "wall_s": d.elapsed(),
                                  "charts/return_recent": reward, **m})
