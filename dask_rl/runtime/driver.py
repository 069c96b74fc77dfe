"""The driver of asynchronous learners (PPO, IMPACT, DQN, ...) on a Dask cluster.

Its parts own their tasks — rollouts, learners, evaluations, the replay buffer's checkpoints,
the cluster follower — and :meth:`Driver.connect` wires them; the driver's loop only waits for
futures, hands each to the part that submitted it, and asks the launch policy what to start.
Trajectories never come to the client. A lost (or hung) parameter actor is re-created from the
latest checkpoint and the work in flight dropped (:meth:`Driver.on_actor_lost`); a lost
rollout or learner worker costs only its tasks.
"""

from __future__ import annotations

import collections
import logging
import time

import numpy as np
from distributed import Future

from dask_rl.algos import registry
from dask_rl.algos.replay import ReplayAlgorithm
from dask_rl.checkpoint import Pending
from dask_rl.config import public_dict
from dask_rl.control.accounting import Accounting
from dask_rl.control.launch import Discarded, LaunchPolicy
from dask_rl.control.replay import TrajectoryReplay
from dask_rl.data import Evaluation
from dask_rl.data.summary import LearnerSummary
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat
from dask_rl.models.normalizer import empty_moments
from dask_rl.runtime.cluster import attach_dashboard
from dask_rl.runtime.evaluations import EvaluationTasks
from dask_rl.runtime.follower import ALLOCATE_EVERY_S, ClusterFollower
from dask_rl.runtime.inflight import InFlight, Task
from dask_rl.runtime.learners import LearnerTasks
from dask_rl.runtime.replay_checkpoint import ReplayCheckpoint
from dask_rl.runtime.rollouts import RolloutTasks
from dask_rl.runtime.run import Abandoned, RunFailed
from dask_rl.runtime.sampled import SampledReplay
from dask_rl.runtime.tasks import evaluate_task
from dask_rl.runtime.timers import Timers
from dask_rl.runtime.trainer import MAX_CONSECUTIVE_FAILURES, Trainer
from dask_rl.staleness import STRATEGIES

logger = logging.getLogger(__name__)

LEARNER_DRAIN_S = 60.0  # how long the end of a run waits for learners already in flight
# ... and an interrupted run's end, in seconds after the signal (their pushes may be done)
INTERRUPTED_LEARNERS_BY_S = 5.0


class Driver(Trainer):
    """The asynchronous trainer; :meth:`run` returns a
    :class:`~dask_rl.data.summary.LearnerSummary`.

    Takes the arguments of :class:`~dask_rl.runtime.run.Run`; ``progress`` is called after
    every learner result.
    """

    evaluation_task = staticmethod(evaluate_task)   # greedy: the mode of each action

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.algorithm = registry.build(self.cfg.algo)
        self.needs = self.algorithm.needs
        self.inflight = InFlight(self.client)   # every task held, with the part that handles it
        self.failures: collections.Counter[str] = collections.Counter()
        # per-trainer hyperparameters (population-based training): learner.lr and algo.*
        self.hparams: dict[str, float] = {}
        self.connect()

    def connect(self) -> None:
        """The dataflow, one part per stage (``docs/architecture.md`` quotes this function)."""
        cfg, needs = self.cfg, self.needs
        # a replay algorithm's trajectories fill a buffer on the workers; IMPACT's wait there
        # for their next uses
        self.sampled = (SampledReplay(cfg, self.client, self.run_name)
                        if isinstance(self.algorithm, ReplayAlgorithm) else None)
        self.replay = (TrajectoryReplay(replay=needs.replay, capacity=needs.replay_capacity)
                       if needs.replay > 1 else None)
        # the launch policy decides what starts: rollouts on free slots, learners on
        # trajectories (its slots are set once the cluster's size is known)
        # an on-policy algorithm without replay learns each trajectory in the task that
        # collected it (learner.fused)
        fused = (cfg.learner.fused and self.sampled is None and self.replay is None
                 and cfg.learner.gpus == 0 and cfg.cluster.adapt is None)
        self.policy: LaunchPolicy[Future] = LaunchPolicy(
            slots=0, max_learners=cfg.learner.max_learners,
            max_ready=cfg.rollout.max_ready or cfg.learner.max_learners,
            synchronous=STRATEGIES[cfg.aggregation.strategy].synchronous,
            replay=self.replay, sampled=self.sampled is not None, fused=fused)
        self.accounting = Accounting()                 # what every task cost and produced
        self.rollouts = RolloutTasks(self)             # slot -> trajectory (stays on a worker)
        self.learners = LearnerTasks(self)             # trajectory -> gradient -> actor
        self.evaluations = EvaluationTasks(self)       # actor's policy -> the gate's verdict
        self.replay_checkpoint = ReplayCheckpoint(self)    # replay buffers <-> checkpoints
        self.follower = ClusterFollower(self, sized=self.sampled is None)  # cluster -> slots

    def timers(self) -> Timers:
        """The periodic duties, on their periods in seconds (0: each pass of the loop)."""
        return Timers([(1.0, self.follower.rescale),
                       (ALLOCATE_EVERY_S, self.follower.allocate),
                       (1.0, self.follower.report),
                       (0.0, self.checkpoints.maybe),     # on checkpoint.every_s
                       (0.0, self.housekeeper.maybe_tidy)],
                      first_after=(self.follower.rescale,))

    # ---- hooks ---------------------------------------------------------------------------------
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        self.follower.check_resources()
        return initial_parameters(self.cfg, self.algorithm)

    def actor_options(self) -> dict:
        return {"target_every": self.needs.target_network_every}

    def driver_state(self) -> dict:
        extra = self.sampled.state() if self.sampled is not None else {}
        return {"learner_seq": self.learners.seq, "rollout_seq": self.rollouts.seq,
                **self.evaluations.schedule.state(), **extra}

    def load_driver_state(self, d: dict) -> None:
        self.learners.seq = int(d["learner_seq"])
        self.rollouts.seq = int(d["rollout_seq"])
        self.evaluations.schedule.load_state(d)
        if self.sampled is not None:
            self.sampled.load_state(d)
        self.accounting.env_steps_collected = self.env_steps

    def write_extra(self, pending: Pending) -> tuple[list[dict[str, int]], dict]:
        return self.replay_checkpoint.write(pending)

    def restore_extra(self, name: str, meta: dict) -> None:
        self.replay_checkpoint.restore(self.store.url(name), meta)

    def on_actor_lost(self, reason: str) -> None:
        """Re-create the parameter actor from the latest checkpoint and carry on.

        Everything in flight talks to the lost actor, and trajectories waiting for learners may
        be lost with their workers (Dask would recompute them with the old actor's handle): all
        of it is dropped and counted. Gradients computed on versions newer than the checkpoint
        die with their learner tasks, so none is ever applied.
        """
        lost = self.inflight.clear()
        self.learners.clear()
        gone = self.policy.discard_all()
        self._discarded(gone)
        self.replay_lost += gone.replay
        if self.sampled is not None:
            self.replay_lost += self.sampled.lost()
            self.policy.replay_changed(ready=False, behind=False)
        if lost:
            self.client.cancel(lost)
        self.replace_actor(reason)
        self.failures.clear()
        self.evaluations.schedule.reset()
        self.gate.target_hit = False     # the policy that reached it is gone
        self.policy.resume()

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> LearnerSummary:
        """Train until a stop condition holds; returns the summary (also in summary.json)."""
        try:
            cfg = self.cfg
            self.open()  # waits for a worker to hold the parameter actor
            threads = sum(self.client.nthreads().values())
            slots = self.follower.start()
            timers = self.timers()
            logger.info("run %s: %d rollout slots, %d learners max, %d worker threads, %s",
                        self.run_name, slots, cfg.learner.max_learners, threads,
                        cfg.aggregation.strategy)
            self.metrics.write("run", {"event": "start", "config": public_dict(cfg),
                                       "rollout_slots": slots})
            if not self.interrupted:
                self._launch()
            attach_dashboard(self.client)   # an embedded cluster's, now that work is out
            while not self.policy.finished:
                done = self.inflight.wait_some(0.5)
                for fut in done:
                    if fut in self.inflight:  # a recovery may have cleared it meanwhile
                        self._handle(fut, self.inflight.pop(fut))
                self.follower.watch_stall(bool(done), len(self.inflight))
                self.check_heartbeat()
                self._check_stop()
                if self.interrupted:
                    break
                timers.run()
                self._launch()
                self.evaluations.maybe_screen()
                self.evaluations.maybe_confirm()
            return self._finish()
        except Abandoned as e:   # interrupted while waiting on something that did not end
            logger.info("interrupted: %s", e)
            return self._finish_interrupted()
        except RunFailed:
            raise
        except Exception as e:
            if self.interrupted and hasattr(self, "metrics"):
                # a cluster going with the signal (a closed comm, a lost worker): the end
                # still comes, with its summary
                logger.warning("interrupted: %s", " ".join(
                    f"{type(e).__name__}: {e}".split())[:300])
                return self._finish_interrupted()
            self.check_scheduler()  # a lost scheduler is one line, not this traceback
            raise
        finally:
            self.close(list(self.inflight))

    def _check_stop(self) -> None:
        if self.interrupted:  # even a drain in progress ends now: its workers may be going
            self.policy.stop(drain=False)
            return
        if self.policy.stopping:
            return
        reason = self.stop_reason or self.budget_reason()
        if reason is None and self.accounting.env_steps_collected >= self.cfg.stop.env_steps:
            reason = "env_steps"
        if reason is not None:
            # Budget reached: learn from everything collected, then end.
            self.stop_reason = reason
            self.policy.stop(drain=reason == "env_steps")
            if self.policy.draining:
                self.metrics.write("phase", {"phase": "drain", "event": "start",
                                             "env_steps": self.env_steps})

    def _handle(self, fut: Future, task: Task) -> None:
        if fut.status != "finished":
            self._failed(fut, task)
            return
        self.failures[task.kind] = 0
        self.accounting.cycle(task.kind, time.monotonic() - task.submitted)
        if not task.fetch:
            task.done(fut, task)
            return
        fetched = self.inflight.fetched(fut)
        if fetched is not None:   # on the event loop, as it ended
            ok, result = fetched
            if ok:
                task.done(result, task)
            else:
                self._failed(fut, task, result)
            return
        try:
            # finished, but its result may be gone with a worker since: Dask recomputes it,
            # and the recomputation can fail (its actor may be gone too) or, on a cluster that
            # is going, never end (given up once interrupted)
            result = self.wait_for(fut)
        except Exception as e:
            self._failed(fut, task, e)
            return
        task.done(result, task)

    def _failed(self, fut: Future, task: Task, exc: BaseException | None = None) -> None:
        if exc is None:
            exc = fut.exception() if fut.status == "error" else None
        logger.warning("%s task %s: %r", task.kind, fut.status, exc)
        if self.interrupted:  # its worker may be going: the end drops it (discard_all)
            return
        if not self.supervisor.alive(timeout=min(5.0, self.cfg.checkpoint.actor_timeout_s)):
            self.on_actor_lost(f"a {task.kind} task failed and the parameter actor is gone: "
                               f"{exc!r}")
            return
        self.failures[task.kind] += 1
        if self.failures[task.kind] >= MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self.failures[task.kind]} {task.kind} tasks failed in a row; "
                               f"last error: {exc!r}") from exc
        if task.lost is not None:
            task.lost(task)

    def _discarded(self, gone: Discarded) -> None:
        self.accounting.dropped(trajectories=gone.trajectories, rollouts=gone.rollouts)

    # ---- launching -----------------------------------------------------------------------------
    def _launch(self) -> None:
        """Submit what the launch policy decides."""
        launches = self.policy.decide()
        if launches.fused and self.policy.synchronous:
            recoveries = self.recoveries
            self.learners.announce([f.slot for f in launches.fused])
            if self.recoveries != recoveries:  # the actor was replaced meanwhile: start over
                return
        for fused in launches.fused:
            self.learners.submit_fused(fused)
        for launch in launches.learners:
            self.learners.submit(launch.trajectory, launch.first_use, launch.concurrent)
        if launches.rollouts and self.policy.synchronous:
            recoveries = self.recoveries
            self.learners.announce(launches.rollouts)
            if self.recoveries != recoveries:  # the actor was replaced meanwhile: start over
                return
        for slot in launches.rollouts:
            self.rollouts.submit(slot)

    def replay_changed(self) -> None:
        """Tell the launch policy where the replay buffer stands (sampled learners)."""
        assert self.sampled is not None
        self.policy.replay_changed(ready=self.sampled.ready,
                                   behind=self.sampled.behind(self.accounting.env_steps_collected))

    # ---- the end -------------------------------------------------------------------------------
    def _finish(self) -> LearnerSummary:
        self.hooks.finishing(self)
        if self.interrupted:
            return self._finish_interrupted()
        try:
            return self._finish_normal()
        except Abandoned as e:   # interrupted during the end: what is left of it, on its clock
            logger.info("interrupted at the end of the run: %s", e)
            return self._finish_interrupted()

    def _finish_normal(self) -> LearnerSummary:
        self.metrics.write("phase", {"phase": "end", "event": "start",
                                     "stop_reason": self.stop_reason})
        # A learner in flight may already have pushed: let it end so that its env steps and
        # update are counted (the summary agrees with the actor's state); rollouts are cancelled.
        learners = self.inflight.at_end("wait")
        if learners:
            try:
                self.wait_all(learners, LEARNER_DRAIN_S)
            except TimeoutError:
                logger.warning("learners still running at the end; their updates are not counted")
            for fut in learners:
                if fut.status == "finished":
                    self._handle(fut, self.inflight.pop(fut))
        cancelled = self.inflight.at_end("cancel") + self.inflight.at_end("wait")
        if cancelled:
            self.client.cancel(cancelled)
        self.inflight.drop(cancelled)
        if not self.supervisor.alive():
            self.on_actor_lost("the parameter actor was lost at the end of the run")
        # the final policy (and the replay buffer, for --resume) are safe before the last calls
        self.checkpoints.write()
        self._discarded(self.policy.discard_all())
        final = self.gate.final(self.evaluations.now)
        return self.end(self._summary(final, self.actor_call("metrics")))

    def _finish_interrupted(self) -> LearnerSummary:
        """The end of an interrupted run, within ``INTERRUPT_DEADLINE_S`` of the signal whatever
        was in flight: learners get until ``INTERRUPTED_LEARNERS_BY_S``, everything else is
        cancelled, the final checkpoint is written only if the actor answers in time
        (:meth:`~dask_rl.runtime.checkpoints.Checkpoints.final`), no evaluation is started,
        and the summary takes what the driver knows where the actor is silent. Errors of a
        cluster that is going (closed comms, lost workers) end in the summary, not a
        traceback."""
        self.abandon_after = INTERRUPTED_LEARNERS_BY_S
        learners = self.inflight.at_end("wait")
        try:
            if learners:
                self.wait_all(learners)
        except Exception:  # Abandoned: those still running are not counted
            logger.warning("interrupted: %d learners still running are not waited for",
                           sum(not f.done() for f in learners))
        for fut in learners:
            if fut.status == "finished" and fut in self.inflight:
                try:
                    self._handle(fut, self.inflight.pop(fut))
                except Exception as e:  # e.g. a round's end the actor no longer answers
                    logger.info("interrupted: a learner's result not taken (%s)",
                                type(e).__name__)
        try:
            if self.inflight:
                self.client.cancel(self.inflight.clear())
        except Exception:
            logger.debug("cancelling at the end", exc_info=True)
        self.inflight.clear()
        self._discarded(self.policy.discard_all())
        written = self.checkpoints.final()
        final = self.gate.final(self.evaluations.now)  # the last one; none is started
        return self.end(self._summary(final, self.final_actor_metrics()),
                        extra=self.interrupted_extra(written))

    def _summary(self, final: Evaluation | None, pulls: dict) -> LearnerSummary:
        fields = self.trainer_summary(final, pulls)
        busy = max(fields["wall_s"] * fields["worker_threads"], 1e-9)
        a = self.accounting
        return LearnerSummary(
            **fields, strategy=self.cfg.aggregation.strategy,
            rollout_slots=self.policy.slots, env_steps_collected=a.env_steps_collected,
            trajectories_produced=a.trajectories_produced,
            trajectories_consumed=a.trajectories_consumed,
            dropped_trajectories=a.dropped_trajectories,
            cancelled_rollouts=a.cancelled_rollouts, trajectory_bytes=a.trajectory_bytes,
            learner_time_share=a.learner_busy_s / busy,
            rollout_time_share=a.rollout_busy_s / busy,
            rollout_pulls=pulls["actor/rollout_pulls"],
            rollout_loads=pulls["actor/rollout_loads"],
            channel_trips=pulls.get("actor/channel_trips"))


def initial_parameters(cfg, algorithm) -> tuple[np.ndarray, dict | None]:
    """The parameter actor's first version: the model's flat parameters (seeded by
    ``cfg.seed``) and empty running statistics for what the env normalises."""
    obs_space, action_space = env_spaces(cfg.env)
    model = algorithm.make_model(obs_space, action_space, cfg.model,
                                 normalize_obs=cfg.env.normalize_obs, seed=cfg.seed)
    moments = {}
    if cfg.env.normalize_obs:
        moments["obs"] = empty_moments(int(np.prod(obs_space.shape)))
    if cfg.env.normalize_reward:
        moments["return"] = empty_moments(1)
    return get_flat(model), moments or None
