"""The driver of asynchronous learners (PPO, IMPACT, ...) on a Dask cluster.

It executes the decisions of a :class:`~dask_rl.control.launch.LaunchPolicy` — rollout tasks
on slots, learner tasks on trajectories (Stellaris' on-demand learners) — and reports what
came of them back to it; it evaluates greedily, checkpoints, recovers and stops. Trajectories
never come to the client: the driver only holds their futures, and learner tasks return small
:class:`~dask_rl.data.LearnerReport` s. When the algorithm asks for replay
(:attr:`~dask_rl.algos.base.Needs.replay`), the futures of recent trajectories wait in a
:class:`~dask_rl.control.replay.TrajectoryReplay` on their workers.

Failures: a lost rollout or learner worker costs only its tasks, which Dask re-runs; a lost
(or hung) parameter actor is noticed by the supervisor's heartbeat or by failing tasks, and the
driver re-creates it from the latest checkpoint (one is written at the start), drops the work
in flight — gradients computed on versions newer than the checkpoint are never applied — and
goes on. Each recovery is logged, written to metrics.jsonl and counted in the summary.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable

import numpy as np
from distributed import Future, wait

from dask_rl.algos import registry
from dask_rl.algos.replay import ReplayAlgorithm
from dask_rl.checkpoint import Pending
from dask_rl.config import public_dict
from dask_rl.control.accounting import Accounting
from dask_rl.control.launch import Discarded, LaunchPolicy
from dask_rl.control.replay import TrajectoryReplay
from dask_rl.control.schedule import EvalSchedule, learner_seed, learning_rate
from dask_rl.data import Evaluation, LearnerReport
from dask_rl.data.summary import LearnerSummary
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat
from dask_rl.models.normalizer import empty_moments
from dask_rl.runtime.follower import ALLOCATE_EVERY_S, ClusterFollower
from dask_rl.runtime.run import Abandoned, RunFailed
from dask_rl.runtime.sampled import SampledReplay
from dask_rl.runtime.tasks import (
    evaluate_task,
    learner_task,
    read_replay_task,
    rollout_task,
    write_replay_task,
)
from dask_rl.runtime.timers import Timers
from dask_rl.runtime.trainer import MAX_CONSECUTIVE_FAILURES, Trainer
from dask_rl.staleness import STRATEGIES

logger = logging.getLogger(__name__)

LEARNER_DRAIN_S = 60.0  # how long the end of a run waits for learners already in flight
# ... and an interrupted run's end, in seconds after the signal (their pushes may be done)
INTERRUPTED_LEARNERS_BY_S = 5.0
REPLAY_WRITE_TIMEOUT_S = 120.0  # a checkpoint's replay writes unfinished by then: not published


@dataclasses.dataclass(frozen=True)
class _Task:
    """What the driver remembers of a future it holds, and who handles it: ``done`` takes the
    task's result (or, when ``fetch`` is False, its future: a trajectory stays where it is);
    ``lost`` undoes what a failed task leaves behind; ``at_end`` says whether the end of a
    run waits for it (``wait``), keeps it (``keep``) or cancels it (``cancel``)."""

    kind: str                 # a label (logs, failure counts, task-time accounting)
    done: Callable[[Any, "_Task"], None]
    lost: Callable[["_Task"], None] | None = None
    fetch: bool = True
    at_end: str = "cancel"
    slot: int = -1
    learner_id: str = ""
    first_use: bool = True    # learner: the trajectory's first learning (not a replay)
    concurrent: int = 0       # learner: learners in flight when it was launched, itself included
    submitted: float = dataclasses.field(default_factory=time.monotonic)


class Driver(Trainer):
    """The asynchronous trainer; :meth:`run` returns a
    :class:`~dask_rl.data.summary.LearnerSummary`.

    Takes the arguments of :class:`~dask_rl.runtime.run.Run`; ``progress`` is called after
    every learner result.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.algorithm = registry.build(self.cfg.algo)
        self.needs = self.algorithm.needs
        # value-based learners sample a worker-resident replay buffer (TianJi's replay path)
        self.sampled: SampledReplay | None = None
        if isinstance(self.algorithm, ReplayAlgorithm):
            self.sampled = SampledReplay(self.cfg, self.client, self.run_name)
        self.replay: TrajectoryReplay[Future] | None = None
        if self.needs.replay > 1:
            self.replay = TrajectoryReplay(replay=self.needs.replay,
                                           capacity=self.needs.replay_capacity)
        self.accounting = Accounting()
        # slots are set once the cluster's size is known (run)
        self.policy: LaunchPolicy[Future] = LaunchPolicy(
            slots=0, max_learners=self.cfg.learner.max_learners,
            max_ready=self.cfg.rollout.max_ready or self.cfg.learner.max_learners,
            synchronous=STRATEGIES[self.cfg.aggregation.strategy].synchronous,
            replay=self.replay, sampled=self.sampled is not None)
        self.evaluations = EvalSchedule(every_updates=self.cfg.stop.eval_every_updates,
                                        target=self.target)
        self.inflight: dict[Future, _Task] = {}
        self.failures: collections.Counter[str] = collections.Counter()
        self.learner_seq = 0   # checkpointed, so task keys and seeds never repeat
        self.rollout_seq = 0
        # synchronous rounds: the learner each slot's trajectory will get, announced up front
        self.round_learners: dict[int, str] = {}
        self.trajectory_learner: dict[Future, str] = {}
        self.last_progress = time.monotonic()  # when a task last finished (the stall watchdog)
        self.follower = ClusterFollower(self, sized=self.sampled is None)
        # per-trainer hyperparameters (population-based training): learner.lr and algo.*
        self.hparams: dict[str, float] = {}

    # ---- hooks ---------------------------------------------------------------------------------
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        cfg = self.cfg
        self._check_resources()
        obs_space, action_space = env_spaces(cfg.env)
        model = self.algorithm.make_model(obs_space, action_space, cfg.model,
                                          normalize_obs=cfg.env.normalize_obs, seed=cfg.seed)
        moments = {}
        if cfg.env.normalize_obs:
            moments["obs"] = empty_moments(int(np.prod(obs_space.shape)))
        if cfg.env.normalize_reward:
            moments["return"] = empty_moments(1)
        return get_flat(model), moments or None

    def actor_options(self) -> dict:
        return {"target_every": self.needs.target_network_every}

    def driver_state(self) -> dict:
        extra = self.sampled.state() if self.sampled is not None else {}
        return {"learner_seq": self.learner_seq, "rollout_seq": self.rollout_seq,
                **self.evaluations.state(), **extra}

    def load_driver_state(self, d: dict) -> None:
        self.learner_seq = int(d["learner_seq"])
        self.rollout_seq = int(d["rollout_seq"])
        self.evaluations.load_state(d)
        if self.sampled is not None:
            self.sampled.load_state(d)
        self.accounting.env_steps_collected = self.env_steps

    def write_extra(self, pending: Pending) -> tuple[list[dict[str, int]], dict]:
        """An off-policy run's replay buffer, written by the workers holding it: IMPACT's
        trajectories with their uses, or a replay buffer's trajectories with their shapes."""
        if not self.cfg.checkpoint.replay_buffer:
            return [], {}
        if self.replay is not None:
            kept = [(fut, uses) for fut, uses in self.replay.items()
                    if fut.status == "finished"]
            key = "replay_uses"
        elif self.sampled is not None:
            kept = [(fut, [steps, envs]) for fut, steps, envs in self.sampled.buffer.items()
                    if fut.status == "finished"]
            key = "replay_shapes"
        else:
            return [], {}
        if not kept:
            return [], {}
        writes = [self.client.submit(write_replay_task, pending.url, i, fut, pure=False,
                                     retries=0) for i, (fut, _) in enumerate(kept)]
        try:
            # Every write is looked at: one that raised, whose worker died inside it, or that
            # has not finished in time fails this checkpoint (Trainer.checkpoint keeps the
            # previous one latest).
            self.wait_all(writes, REPLAY_WRITE_TIMEOUT_S)   # TimeoutError if one is not done
            written = [w.result() for w in writes]
        finally:
            self.client.cancel(writes)
        return written, {key: [extra for _, extra in kept]}

    def restore_extra(self, name: str, meta: dict) -> None:
        """Reload a checkpoint's replay buffer onto the workers (never through the driver)."""
        url = self.store.url(name)
        count = meta.get("replay", 0)
        checksums = meta.get("replay_checksums") or [None] * count

        def read(i: int) -> Future:
            return self.client.submit(read_replay_task, url, i, checksums[i], pure=False)

        if self.replay is not None:
            uses = meta.get("replay_uses", [])[:count]
            self.replay.restore([(read(i), n) for i, n in enumerate(uses)])
        elif self.sampled is not None:
            shapes = meta.get("replay_shapes", [])[:count]
            self.sampled.buffer.restore([(read(i), s, e) for i, (s, e) in enumerate(shapes)])
            self._replay_changed()

    def on_actor_lost(self, reason: str) -> None:
        """Re-create the parameter actor from the latest checkpoint and carry on.

        Everything in flight talks to the lost actor, and trajectories waiting for learners may
        be lost with their workers (Dask would recompute them with the old actor's handle): all
        of it is dropped and counted. Gradients computed on versions newer than the checkpoint
        die with their learner tasks, so none is ever applied.
        """
        lost = list(self.inflight)
        self.inflight.clear()
        self.round_learners.clear()
        self.trajectory_learner.clear()
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
        self.evaluations.reset()
        self.target_hit = False          # the policy that reached it is gone
        self.policy.resume()

    def _check_resources(self) -> None:
        gpus = self.cfg.learner.gpus
        if gpus <= 0:
            return
        have = self.client.run_on_scheduler(
            lambda dask_scheduler: [w.resources.get("GPU", 0)
                                    for w in dask_scheduler.workers.values()])
        if not any(g >= gpus for g in have):
            raise RuntimeError(
                f"learner.gpus is {gpus:g} but no worker offers a GPU resource of that size "
                f"(workers offer {have or 'nothing'}); start workers with --resources GPU=1 or "
                f"set learner.gpus: 0")

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> LearnerSummary:
        """Train until a stop condition holds; returns the summary (also in summary.json)."""
        try:
            cfg = self.cfg
            self.open()  # waits for a worker to hold the parameter actor
            threads = sum(self.client.nthreads().values())
            slots = self.follower.start()
            timers = Timers([(1.0, self.follower.rescale),
                             (ALLOCATE_EVERY_S, self.follower.allocate),
                             (1.0, self.follower.report),
                             (0.0, self.maybe_checkpoint),      # on checkpoint.every_s
                             (0.0, self.housekeeper.maybe_tidy)],
                            first_after=(self.follower.rescale,))
            logger.info("run %s: %d rollout slots, %d learners max, %d worker threads, %s",
                        self.run_name, slots, cfg.learner.max_learners, threads,
                        cfg.aggregation.strategy)
            self.metrics.write("run", {"event": "start", "config": public_dict(cfg),
                                       "rollout_slots": slots})
            if not self.interrupted:
                self._launch()
            while not self.policy.finished:
                done = self._wait_some(0.5)
                for fut in done:
                    if fut in self.inflight:  # a recovery may have cleared it meanwhile
                        self._handle(fut, self.inflight.pop(fut))
                self._check_stall(bool(done))
                self.check_heartbeat()
                self._check_stop()
                if self.interrupted:
                    break
                timers.run()
                self._launch()
                self._maybe_evaluate()
                self._maybe_confirm()
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

    def _wait_some(self, timeout: float) -> list[Future]:
        """Futures that completed within ``timeout`` seconds (possibly none)."""
        if not self.inflight:  # e.g. no worker yet: nothing to wait for, do not spin
            time.sleep(min(timeout, 0.1))
            return []
        try:
            done, _ = wait(list(self.inflight), timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        return list(done)

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

    def _handle(self, fut: Future, task: _Task) -> None:
        if fut.status != "finished":
            self._failed(fut, task)
            return
        self.failures[task.kind] = 0
        self.accounting.cycle(task.kind, time.monotonic() - task.submitted)
        if not task.fetch:
            task.done(fut, task)
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

    def _failed(self, fut: Future, task: _Task, exc: BaseException | None = None) -> None:
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

    def _rollout_done(self, trajectory: Future, task: _Task) -> None:
        self.accounting.rollout_finished(self.cfg.batch_size)
        self.policy.rollout_done(task.slot, trajectory)
        if task.slot in self.round_learners:
            self.trajectory_learner[trajectory] = self.round_learners.pop(task.slot)
        if self.sampled is not None:
            # counted where it lies; a failed count leaves its steps uncounted (the buffer
            # keeps the trajectory)
            self.inflight[self.sampled.stored(trajectory)] = _Task(
                "stats", self._on_rollout_counted, at_end="wait")
            self._replay_changed()

    def _rollout_lost(self, task: _Task) -> None:
        self.policy.rollout_failed(task.slot)
        if task.slot in self.round_learners:  # its learner will never come
            self.actor_call("learner_lost", self.round_learners.pop(task.slot), on_loss="skip")

    def _learner_lost(self, task: _Task) -> None:
        self.policy.learner_failed(task.first_use)
        self.actor_call("learner_lost", task.learner_id, on_loss="skip")
        self.accounting.dropped(trajectories=int(task.first_use))

    def _confirmed(self, result: Evaluation, task: _Task) -> None:
        if not self.record_confirmation(result) and self.stop_reason is None:
            self.policy.resume()   # not confirmed: train on
            self.evaluations.hold_target(self.updates)

    def _discarded(self, gone: Discarded) -> None:
        self.accounting.dropped(trajectories=gone.trajectories, rollouts=gone.rollouts)

    # ---- launching -----------------------------------------------------------------------------
    def _launch(self) -> None:
        """Submit what the launch policy decides."""
        launches = self.policy.decide()
        for launch in launches.learners:
            self._submit_learner(launch.trajectory, launch.first_use, launch.concurrent)
        if launches.rollouts and self.policy.synchronous:
            recoveries = self.recoveries
            self._announce_round(launches.rollouts)
            if self.recoveries != recoveries:  # the actor was replaced meanwhile: start over
                return
        for slot in launches.rollouts:
            self._submit_rollout(slot)

    def _announce_round(self, slots: list[int]) -> None:
        """A synchronous round starts: its learners are known now (one per slot), so the
        barrier waits for every one of them, even those whose trajectory is not collected."""
        for slot in slots:
            self.learner_seq += 1
            self.round_learners[slot] = f"L{self.learner_seq}"
        # skipped on loss: the recovery drops this round, a new one is announced
        self.actor_call("expect_learners", [self.round_learners[s] for s in slots],
                        on_loss="skip")

    def _submit_rollout(self, slot: int) -> None:
        self.rollout_seq += 1
        placement = self.follower.placement(slot)
        # replay algorithms act as they explore (DQN: epsilon-greedy on its action values)
        exploration = (self.algorithm.exploration(self.accounting.env_steps_collected)
                       if self.sampled is not None else None)
        fut = self.client.submit(rollout_task, self.run_name, slot, self.actor, exploration,
                                 pure=False,
                                 key=f"rollout-{slot}-{self.rollout_seq}-{self.run_name}",
                                 **placement)
        self.inflight[fut] = _Task("rollout", self._rollout_done, self._rollout_lost,
                                   fetch=False, slot=slot)

    def _submit_learner(self, trajectory: Future | None, first_use: bool,
                        concurrent: int) -> None:
        cfg = self.cfg.learner
        lid = self.trajectory_learner.pop(trajectory, None) if first_use else None
        if lid is None:
            self.learner_seq += 1
            lid = f"L{self.learner_seq}"
        kwargs = {"resources": {"GPU": cfg.gpus}} if cfg.gpus > 0 else {}
        if trajectory is None:  # a sampled learner (value-based, on the replay buffer)
            assert self.sampled is not None
            fut, record = self.sampled.submit_learner(
                self.actor, lid, self._learning_rate(), learner_seed(self.cfg.seed, int(lid[1:])),
                int(lid[1:]), **kwargs)
            self.metrics.write("replay", {"env_steps": self.env_steps, "learner": lid,
                                          **record})
            self.metrics.write("phase", {"phase": "learner", "event": "start", "learner": lid,
                                         "first_use": False})
            self.inflight[fut] = _Task("learner", self._on_learner, self._learner_lost,
                                       at_end="wait", learner_id=lid, first_use=False,
                                       concurrent=concurrent)
            return
        overrides = {k.split(".", 1)[1]: v for k, v in self.hparams.items()
                     if k.startswith("algo.")}
        fut = self.client.submit(learner_task, self.run_name, trajectory, self.actor, lid,
                                 self._learning_rate(),
                                 learner_seed(self.cfg.seed, int(lid[1:])),
                                 overrides or None, first_use, int(lid[1:]), pure=False,
                                 key=f"learner-{lid}-{self.run_name}", **kwargs)
        self.metrics.write("phase", {"phase": "learner", "event": "start", "learner": lid,
                                     "first_use": first_use})
        self.inflight[fut] = _Task("learner", self._on_learner, self._learner_lost,
                                   at_end="wait", learner_id=lid, first_use=first_use,
                                   concurrent=concurrent)

    def _learning_rate(self) -> float:
        cfg = self.cfg.learner
        return learning_rate(self.hparams.get("learner.lr", cfg.lr), anneal=cfg.anneal_lr,
                             env_steps=self.env_steps, total_env_steps=self.cfg.stop.env_steps)

    def _check_stall(self, progressed: bool) -> None:
        """Degrade instead of stalling: when nothing finished for ``checkpoint.stall_s`` while
        tasks are in flight, say why (workers paused for memory run nothing); when every
        worker is paused, nothing ever will: end the run with one line."""
        now = time.monotonic()
        if progressed or not self.inflight:
            self.last_progress = now
            return
        stalled = now - self.last_progress
        if stalled < self.cfg.checkpoint.stall_s:
            return
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        paused = [a for a, w in workers.items() if w.get("status") == "paused"]
        if workers and len(paused) == len(workers):
            limit = min(w.get("memory_limit") or 0 for w in workers.values()) / 2**30
            raise self.fail(
                f"no task finished in {stalled:.0f} s: all {len(workers)} workers are paused "
                f"for memory (limit {limit:.1f} GiB each); give them more memory "
                f"(cluster.memory_limit, bigger pods) or use fewer env.num_envs", "stalled")
        logger.warning("no task finished in %.0f s with %d in flight (%d of %d workers paused "
                       "for memory)", stalled, len(self.inflight), len(paused), len(workers))
        self.metrics.write("stall", {"seconds": stalled, "in_flight": len(self.inflight),
                                     "paused_workers": len(paused), "workers": len(workers)})
        self.last_progress = now

    # ---- results -------------------------------------------------------------------------------
    def _on_learner(self, report: LearnerReport, task: _Task) -> None:
        first_use = task.first_use
        self.updates = max(self.updates, report.ack.version)
        self.accounting.learner_finished(first_use=first_use, task_s=report.task_s,
                                         collect_s=report.collect_s,
                                         trajectory_bytes=report.trajectory_bytes)
        returns, lengths = report.episode_returns, report.episode_lengths
        if first_use:  # a replay learns from the same steps and episodes again
            self.env_steps += report.trajectory_steps
            self.returns.extend(returns)
            self.episodes += len(returns)
        else:
            returns, lengths = [], []
        steps_per_s = self.steps_per_s(self.accounting.env_steps_collected)
        self.metrics.write("learner", {
            "env_steps": self.env_steps,
            "env_steps_collected": self.accounting.env_steps_collected,
            "updates": self.updates, "wall_s": self.elapsed(), "steps_per_s": steps_per_s,
            "charts/episodic_return": float(np.mean(returns)) if returns else None,
            "charts/episodic_length": float(np.mean(lengths)) if lengths else None,
            "charts/return_recent": self.recent_return(), "episodes": self.episodes,
            "charts/learning_rate": self._learning_rate(), **report.record(),
            "replay": not first_use, "learners/in_flight": task.concurrent,
            "learner": task.learner_id})
        if self.sampled is not None:
            self.sampled.learner_done(int(report.stats.get("learner/epochs", 0))
                                      * int(report.stats.get("learner/batch", 0)))
            self._replay_changed()
        if self.policy.learner_done(first_use):
            self._end_round()
        self.report_progress(steps_per_s=steps_per_s)

    def _on_rollout_counted(self, stats, task: _Task) -> None:
        """A sampled run's rollout counted where it lies: its env steps and episodes."""
        self.env_steps += stats.env_steps
        self.returns.extend(stats.episode_returns)
        self.episodes += len(stats.episode_returns)
        self.metrics.write("rollout", {
            "env_steps": self.env_steps, "wall_s": self.elapsed(),
            "charts/episodic_return": float(np.mean(stats.episode_returns))
            if stats.episode_returns else None,
            "charts/episodic_length": float(np.mean(stats.episode_lengths))
            if stats.episode_lengths else None,
            "charts/return_recent": self.recent_return(), "episodes": self.episodes,
            "rollout/policy_version": stats.policy_version,
            "rollout/collect_s": stats.collect_s})
        self.report_progress()

    def _replay_changed(self) -> None:
        """Tell the launch policy where the replay buffer stands (sampled learners)."""
        assert self.sampled is not None
        self.policy.replay_changed(ready=self.sampled.ready,
                                   behind=self.sampled.behind(self.accounting.env_steps_collected))

    def _end_round(self) -> None:
        """A round: one trajectory per rollout slot learned. The strategy may adapt to it."""
        reward = self.recent_return()
        m = self.actor_call("round_end", **({"reward": reward} if reward is not None else {}))
        self.metrics.write("round", {"env_steps": self.env_steps, "wall_s": self.elapsed(),
                                     "charts/return_recent": reward, **m})

    # ---- evaluation ----------------------------------------------------------------------------
    def _maybe_evaluate(self) -> None:
        if self.stop_reason is not None or self.target_hit:
            return
        running = any(t.kind == "eval" for t in self.inflight.values())
        if self.evaluations.due(updates=self.updates, recent_return=self.recent_return(),
                                recent_episodes=len(self.returns), running=running):
            self._submit_eval()

    def _submit_eval(self, kind: str = "eval", episodes: int | None = None,
                     seed: int | None = None) -> Future:
        """An evaluation task: a screening (``eval``) or a confirmation (``confirm``), both held in
        flight, or with ``kind="final"`` one the caller waits for."""
        self.evals += 1
        if seed is None:
            seed = self.confirm_seed() if kind == "confirm" else 10_000 + self.evals
        fut = self.client.submit(
            evaluate_task, self.run_name, self.actor,
            self.cfg.stop.eval_episodes if episodes is None else episodes, seed, pure=False,
            key=f"{'confirm' if kind == 'confirm' else 'evaluate'}-{self.evals}-{self.run_name}")
        if kind != "final":
            self.inflight[fut] = (
                _Task("confirm", self._confirmed, at_end="keep") if kind == "confirm" else
                _Task("eval", lambda result, _: self.record_eval(result), at_end="keep"))
        self.hooks.evaluation_submitted(self, fut)
        self.metrics.write("phase", {"phase": "confirm" if kind == "confirm" else kind,
                                     "event": "start", "key": fut.key,
                                     "env_steps": self.env_steps, "updates": self.updates})
        return fut

    def _maybe_confirm(self) -> None:
        """A screening reached the target: hold the policy still (nothing new starts; learners
        in flight finish) and confirm it on ``confirm_episodes`` fresh episodes. The run then
        stops solved with exactly that policy, or trains on."""
        if not self.target_hit or self.stop_reason is not None:
            return
        self.policy.pause()
        if self.policy.learners_in_flight or any(t.kind == "confirm"
                                                 for t in self.inflight.values()):
            return
        self._submit_eval("confirm", self.confirm_episodes)

    def _evaluate_now(self, episodes: int, seed: int) -> Evaluation:
        while True:
            fut = self._submit_eval("final", episodes, seed)
            try:
                return self.wait_for(fut)
            except Abandoned:
                self.client.cancel([fut])
                raise
            except Exception as e:
                if self.supervisor.alive(timeout=min(5.0, self.cfg.checkpoint.actor_timeout_s)):
                    raise
                self.on_actor_lost(f"the final evaluation failed and the parameter actor is "
                                   f"gone: {e!r}")

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
        learners = [f for f, t in self.inflight.items() if t.at_end == "wait"]
        if learners:
            try:
                self.wait_all(learners, LEARNER_DRAIN_S)
            except TimeoutError:
                logger.warning("learners still running at the end; their updates are not counted")
            for fut in learners:
                if fut.status == "finished":
                    self._handle(fut, self.inflight.pop(fut))
        cancelled = [f for f, t in self.inflight.items() if t.at_end != "keep"]
        if cancelled:
            self.client.cancel(cancelled)
        self.inflight = {f: t for f, t in self.inflight.items()
                         if t.at_end == "keep"}
        if not self.supervisor.alive():
            self.on_actor_lost("the parameter actor was lost at the end of the run")
        # the final policy (and the replay buffer, for --resume) are safe before the last calls
        self.checkpoint()
        self._discarded(self.policy.discard_all())
        final = self.final_evaluation(self._evaluate_now)
        return self.end(self._summary(final, self.actor_call("metrics")))

    def _finish_interrupted(self) -> LearnerSummary:
        """The end of an interrupted run, within ``INTERRUPT_DEADLINE_S`` of the signal whatever
        was in flight: learners get until ``INTERRUPTED_LEARNERS_BY_S``, everything else is
        cancelled, the final checkpoint is written only if the actor answers in time
        (:meth:`~dask_rl.runtime.trainer.Trainer.final_checkpoint`), no evaluation is started,
        and the summary takes what the driver knows where the actor is silent. Errors of a
        cluster that is going (closed comms, lost workers) end in the summary, not a
        traceback."""
        self.abandon_after = INTERRUPTED_LEARNERS_BY_S
        learners = [f for f, t in self.inflight.items() if t.at_end == "wait"]
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
                self.client.cancel(list(self.inflight))
        except Exception:
            logger.debug("cancelling at the end", exc_info=True)
        self.inflight.clear()
        self._discarded(self.policy.discard_all())
        written = self.final_checkpoint()
        final = self.final_evaluation(self._evaluate_now)  # the last one; none is started
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
            rollout_loads=pulls["actor/rollout_loads"])
