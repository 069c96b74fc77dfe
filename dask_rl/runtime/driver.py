"""The driver: the run loop of an asynchronous trainer (PPO, IMPACT) on a Dask cluster.

It keeps ``rollout.num_actors`` rollout tasks in flight, launches a learner task on each
trajectory as it completes (Stellaris' on-demand learners, at most ``learner.max_learners`` at
once), evaluates greedily, checkpoints, and stops. Trajectories never come to the client: the
driver only holds their futures, and learner tasks return a few statistics. Off-policy
algorithms (IMPACT, ``algo.replay > 1``) keep the futures of recent trajectories in a circular
buffer and replay each up to ``replay`` times when learners would otherwise idle — the data
stays on its worker.

Failures: a lost rollout or learner worker costs only its tasks, which Dask re-runs; a lost
(or hung) parameter actor is noticed by the supervisor's heartbeat or by failing tasks, and the
driver re-creates it from the latest checkpoint (one is written at the start), drops the work
in flight — gradients computed on versions newer than the checkpoint are never applied — and
goes on. Each recovery is logged, written to metrics.jsonl and counted in the summary.

Rollouts and learners never wait for each other, unless the aggregation strategy is
``synchronous``: then rollouts run in rounds, each round on the version the previous round's
update produced. A trajectory completed while ``rollout.max_ready`` are already waiting pauses
its rollout slot until learners catch up (backpressure instead of an unbounded queue).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time

import numpy as np
from distributed import Future, wait

from dask_rl.checkpoint import Pending
from dask_rl.config import to_dict
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat, make_model
from dask_rl.models.normalizer import empty_moments
from dask_rl.runtime.adaptive import LOAD_TOPIC
from dask_rl.runtime.cluster import place_slots
from dask_rl.runtime.tasks import (evaluate_task, learner_task, read_replay_task,
                                   rollout_task, write_replay_task)
from dask_rl.runtime.trainer import RECENT_EPISODES, Trainer
from dask_rl.staleness import STRATEGIES

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 5


@dataclasses.dataclass
class _Task:
    kind: str                 # "rollout" | "learner" | "eval"
    slot: int = -1
    learner_id: str = ""
    trajectory: Future | None = None
    first_use: bool = True    # learner: the trajectory's first learning (not a replay)
    concurrent: int = 0       # learner: learners in flight when it was launched, itself included


class Driver(Trainer):
    """The asynchronous trainer (PPO, IMPACT); :meth:`run` returns the summary.

    Takes the arguments of :class:`~dask_rl.runtime.trainer.Trainer`; ``progress`` is called
    after every learner result.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.synchronous = STRATEGIES[cfg.aggregation.strategy].synchronous
        # counters, checkpointed
        self.learner_seq = 0
        self.rollout_seq = 0
        # live state
        self.env_steps_collected = 0
        self.learners_done = 0
        self.inflight: dict[Future, _Task] = {}
        self.ready: collections.deque[Future] = collections.deque()
        self.replay = getattr(cfg.algo, "replay", 1)
        # circular buffer of [trajectory future, times learned], newest last
        self.replay_buffer: collections.deque[list] = collections.deque(
            maxlen=getattr(cfg.algo, "buffer_size", 1))
        self.idle_slots: list[int] = []
        self.failures = collections.Counter()
        # every completed trajectory is learned from or deliberately dropped, and counted
        self.trajectories_produced = 0
        self.trajectories_consumed = 0
        self.dropped_trajectories = 0
        self.cancelled_rollouts = 0
        self.learner_busy_s = 0.0
        self.rollout_busy_s = 0.0
        self.trajectory_bytes = 0
        self.draining = False
        self.last_eval_updates = -1
        self.last_load_report = 0.0
        self.rollout_ema = 0.0  # seconds per rollout / learner task, for the adaptive policy
        self.learner_ema = 0.0
        # per-trainer hyperparameters (population-based training): learner.lr and algo.*
        self.hparams: dict[str, float] = {}

    # ---- hooks ---------------------------------------------------------------------------------
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        cfg = self.cfg
        self._check_resources()
        obs_space, action_space = env_spaces(cfg.env)
        model = make_model(obs_space, action_space, cfg.model,
                           normalize_obs=cfg.env.normalize_obs, seed=cfg.seed)
        moments = {}
        if cfg.env.normalize_obs:
            moments["obs"] = empty_moments(int(np.prod(obs_space.shape)))
        if cfg.env.normalize_reward:
            moments["return"] = empty_moments(1)
        return get_flat(model), moments or None

    def driver_state(self) -> dict:
        return {"learner_seq": self.learner_seq, "rollout_seq": self.rollout_seq}

    def load_driver_state(self, d: dict) -> None:
        self.learner_seq = int(d["learner_seq"])
        self.rollout_seq = int(d["rollout_seq"])
        self.env_steps_collected = self.env_steps

    def write_extra(self, pending: Pending) -> tuple[int, dict]:
        """An off-policy run's replay buffer, written by the workers holding it."""
        replay = [entry for entry in self.replay_buffer if entry[0].status == "finished"]
        if not replay or not self.cfg.checkpoint.replay_buffer:
            return 0, {}
        wait([self.client.submit(write_replay_task, pending.url, i, entry[0], pure=False)
              for i, entry in enumerate(replay)])
        return len(replay), {"replay_uses": [entry[1] for entry in replay]}

    def restore_extra(self, name: str, meta: dict) -> None:
        """Reload a checkpoint's replay buffer onto the workers (never through the driver)."""
        self.replay_buffer.clear()
        url = self.store.url(name)
        for i, uses in enumerate(meta.get("replay_uses", [])[:meta.get("replay", 0)]):
            self.replay_buffer.append(
                [self.client.submit(read_replay_task, url, i, pure=False), uses])

    def summary_extra(self, actor_metrics: dict) -> dict:
        wall = self.elapsed()
        threads = sum(self.client.nthreads().values())
        return {"strategy": self.cfg.aggregation.strategy,
                "env_steps_collected": self.env_steps_collected,
                "trajectories_produced": self.trajectories_produced,
                "trajectories_consumed": self.trajectories_consumed,
                "dropped_trajectories": self.dropped_trajectories,
                "cancelled_rollouts": self.cancelled_rollouts,
                "trajectory_bytes": self.trajectory_bytes,
                "learner_time_share": self.learner_busy_s / max(wall * threads, 1e-9),
                "rollout_time_share": self.rollout_busy_s / max(wall * threads, 1e-9),
                "num_actors": self.num_actors}

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
    def run(self) -> dict:
        """Train until a stop condition holds; returns the summary (also in summary.json)."""
        try:
            self.open()
            threads = sum(self.client.nthreads().values())
            self.num_actors = self.cfg.rollout.num_actors or threads
            self.slot_workers = place_slots(self.client, self.num_actors)
            self.known_workers = set(self.client.nthreads())
            self.last_rescale = time.time()
            logger.info("run %s: %d rollout slots, %d learners max, %d worker threads, %s",
                        self.run_name, self.num_actors, self.cfg.learner.max_learners, threads,
                        self.cfg.aggregation.strategy)
            self.metrics.write("run", {"event": "start", "config": to_dict(self.cfg),
                                       "num_actors": self.num_actors})
            for slot in range(self.num_actors):
                self._submit_rollout(slot)
            while not self._finished():
                for fut in self._wait_some(0.5):
                    if fut in self.inflight:  # a recovery may have cleared it meanwhile
                        self._handle(fut, self.inflight.pop(fut))
                if self.supervisor.heartbeat_due() and not self.supervisor.alive():
                    self._recover("the parameter actor missed its heartbeat")
                self._check_stop()
                self._rescale()
                self._refill()
                self._maybe_evaluate()
                self._report_load()
                self.maybe_checkpoint()
                self.housekeeper.maybe_tidy()
            return self._finish()
        finally:
            self.close(list(self.inflight))

    def _wait_some(self, timeout: float) -> list[Future]:
        """Futures that completed within ``timeout`` seconds (possibly none)."""
        try:
            done, _ = wait(list(self.inflight), timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        return list(done)

    def _finished(self) -> bool:
        if self.stop_reason is None:
            return False
        if self.draining:
            # Budget reached: learn from everything collected, then end.
            busy = any(t.kind in ("rollout", "learner") for t in self.inflight.values())
            return not busy and not self.ready
        return True

    def _check_stop(self) -> None:
        if self.stop_reason is not None:
            return
        reason = self.budget_reason()
        if reason == "env_steps" or (reason is None and self.env_steps_collected
                                     >= self.cfg.stop.env_steps):
            self.stop_reason, self.draining = "env_steps", True
        elif reason == "wall_s":
            self.stop_reason = reason

    def _handle(self, fut: Future, task: _Task) -> None:
        if fut.status != "finished":
            self._failed(fut, task)
            return
        self.failures[task.kind] = 0
        if task.kind == "rollout":
            self.trajectories_produced += 1
            self.env_steps_collected += self.cfg.batch_size
            self.ready.append(fut)
            if task.slot < self.num_actors:
                self.idle_slots.append(task.slot)
        elif task.kind == "learner":
            self._on_learner(fut.result(), task)
        elif task.kind == "eval":
            self.record_eval(fut.result())

    def _failed(self, fut: Future, task: _Task) -> None:
        exc = fut.exception() if fut.status == "error" else None
        logger.warning("%s task %s: %r", task.kind, fut.status, exc)
        if not self.supervisor.alive(timeout=min(5.0, self.cfg.checkpoint.actor_timeout_s)):
            self._recover(f"a {task.kind} task failed and the parameter actor is gone: {exc!r}")
            return
        self.failures[task.kind] += 1
        if self.failures[task.kind] >= MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self.failures[task.kind]} {task.kind} tasks failed in a row; "
                               f"last error: {exc!r}") from exc
        if task.kind == "rollout":
            self.idle_slots.append(task.slot)
        elif task.kind == "learner":
            self.actor.submit("learner_lost", task.learner_id)
            self.dropped_trajectories += task.first_use

    def _drop_pending(self, tasks) -> None:
        """Count what a stop or a recovery throws away: ready trajectories and those whose
        first learner is cancelled are dropped; unfinished rollouts are cancelled."""
        tasks = list(tasks)
        self.dropped_trajectories += len(self.ready) + sum(
            t.kind == "learner" and t.first_use for t in tasks)
        self.cancelled_rollouts += sum(t.kind == "rollout" for t in tasks)

    # ---- recovery ------------------------------------------------------------------------------
    def on_actor_lost(self, reason: str) -> None:
        self._recover(reason)

    def _recover(self, reason: str) -> None:
        """Re-create the parameter actor from the latest checkpoint and carry on.

        Everything in flight talks to the lost actor, and trajectories waiting for learners may
        be lost with their workers (Dask would recompute them with the old actor's handle): all
        of it is dropped and counted. Gradients computed on versions newer than the checkpoint
        die with their learner tasks, so none is ever applied.
        """
        lost = list(self.inflight)
        self._drop_pending(self.inflight.values())
        self.idle_slots = sorted({*self.idle_slots, *(t.slot for t in self.inflight.values()
                                                      if t.kind == "rollout")})
        self.inflight.clear()
        self.ready.clear()
        self.replay_buffer.clear()
        if lost:
            self.client.cancel(lost)
        self.replace_actor(reason)
        self.failures.clear()
        self.last_eval_updates = -1

    # ---- launching -----------------------------------------------------------------------------
    def _report_load(self) -> None:
        """Tell the scheduler's adaptive policy what this trainer wants (once a second)."""
        now = time.time()
        if now - self.last_load_report < 1.0:
            return
        self.last_load_report = now
        kinds = collections.Counter(t.kind for t in self.inflight.values())
        self.client.log_event(LOAD_TOPIC, {
            "run": self.run_name, "rollouts": kinds["rollout"], "ready": len(self.ready),
            "learners": kinds["learner"], "max_learners": self.cfg.learner.max_learners,
            "rollout_s": self.rollout_ema, "learner_s": self.learner_ema,
            "gpu": self.cfg.learner.gpus > 0, "time": now})

    def _rescale(self) -> None:
        """Follow the cluster as workers come and go (adaptive scaling, failures).

        Rollout slots are spread over the current workers again, and, unless
        ``rollout.num_actors`` fixes it, there is one slot per worker thread. Learners follow
        on their own: one is launched per completed trajectory, so more slots mean more
        learners, up to ``learner.max_learners`` (Stellaris' orchestration).
        """
        if time.time() - self.last_rescale < 1.0:
            return
        self.last_rescale = time.time()
        nthreads = self.client.nthreads()
        if not nthreads or set(nthreads) == self.known_workers:
            return
        self.known_workers = set(nthreads)
        old = self.num_actors
        new = self.cfg.rollout.num_actors or sum(nthreads.values())
        self.num_actors = new
        self.slot_workers = place_slots(self.client, new)
        if new > old:
            self.idle_slots.extend(range(old, new))
        # Slots beyond the new count are retired: their tasks finish, they are not resubmitted.
        self.idle_slots = [s for s in self.idle_slots if s < new]
        self.metrics.write("rescale", {"slots": new, "previous": old, "workers": len(nthreads),
                                       "env_steps": self.env_steps})
        logger.info("%d workers: %d rollout slots", len(nthreads), new)

    def _refill(self) -> None:
        self._launch_learners()
        if self.stop_reason is not None:
            return
        if self.synchronous:
            # A round ends when everything it collected has been learned from.
            busy = any(t.kind in ("rollout", "learner") for t in self.inflight.values())
            if busy or self.ready:
                return
        elif len(self.ready) >= (self.cfg.rollout.max_ready or self.cfg.learner.max_learners):
            return
        slots, self.idle_slots = self.idle_slots, []
        for slot in slots:
            self._submit_rollout(slot)

    def _submit_rollout(self, slot: int) -> None:
        self.rollout_seq += 1
        where = self.slot_workers.get(slot)
        placement = {"workers": [where], "allow_other_workers": True} if where else {}
        fut = self.client.submit(rollout_task, self.run_name, slot, self.actor, pure=False,
                                 key=f"rollout-{slot}-{self.rollout_seq}-{self.run_name}",
                                 **placement)
        self.inflight[fut] = _Task("rollout", slot=slot)

    def _next_batch(self) -> tuple[Future, bool] | None:
        """A fresh trajectory if one is ready, else the newest one still owed a replay."""
        if self.ready:
            traj = self.ready.popleft()
            if self.replay > 1:
                self.replay_buffer.append([traj, 1])
            return traj, True
        if self.draining or self.stop_reason is not None:
            return None
        for entry in reversed(self.replay_buffer):
            if entry[1] < self.replay:
                entry[1] += 1
                if entry[1] >= self.replay:
                    self.replay_buffer.remove(entry)
                return entry[0], False
        return None

    def _launch_learners(self) -> None:
        cfg = self.cfg.learner
        running = sum(t.kind == "learner" for t in self.inflight.values())
        while running < cfg.max_learners:
            batch = self._next_batch()
            if batch is None:
                return
            traj, first_use = batch
            self.learner_seq += 1
            lid = f"L{self.learner_seq}"
            seed = int(np.random.SeedSequence([self.cfg.seed, 1, self.learner_seq])
                       .generate_state(1)[0])
            kwargs = {"resources": {"GPU": cfg.gpus}} if cfg.gpus > 0 else {}
            overrides = {k.split(".", 1)[1]: v for k, v in self.hparams.items()
                         if k.startswith("algo.")}
            fut = self.client.submit(learner_task, self.run_name, traj, self.actor, lid,
                                     self._learning_rate(), seed, overrides or None, pure=False,
                                     key=f"learner-{lid}-{self.run_name}", **kwargs)
            running += 1
            self.inflight[fut] = _Task("learner", learner_id=lid, trajectory=traj,
                                       first_use=first_use, concurrent=running)

    def _learning_rate(self) -> float:
        cfg = self.cfg.learner
        lr = self.hparams.get("learner.lr", cfg.lr)
        if not cfg.anneal_lr:
            return lr
        frac = 1.0 - self.env_steps / self.cfg.stop.env_steps
        return lr * max(frac, 0.01)

    # ---- results -------------------------------------------------------------------------------
    def _on_learner(self, stats: dict, task: _Task) -> None:
        first_use = task.first_use
        self.updates = max(self.updates, stats["version_after"])
        self.learner_busy_s += stats["learner/task_s"]
        self.learner_ema = _ema(self.learner_ema, stats["learner/task_s"])
        self.rollout_ema = _ema(self.rollout_ema, stats["rollout/collect_s"])
        returns = stats.pop("episode_returns")
        lengths = stats.pop("episode_lengths")
        if first_use:  # a replay learns from the same steps and episodes again
            self.trajectories_consumed += 1
            self.env_steps += stats["trajectory_steps"]
            self.rollout_busy_s += stats["rollout/collect_s"]
            self.trajectory_bytes += stats["trajectory_bytes"]
            self.returns.extend(returns)
            self.episodes += len(returns)
        else:
            returns, lengths = [], []
        stats["replay"] = not first_use
        stats["learners/in_flight"] = task.concurrent
        self.learners_done += 1
        record = {
            "env_steps": self.env_steps, "env_steps_collected": self.env_steps_collected,
            "updates": self.updates, "wall_s": self.elapsed(),
            "steps_per_s": self.env_steps_collected / max(self.elapsed() - self.wall_offset,
                                                          1e-9),
            "charts/episodic_return": float(np.mean(returns)) if returns else None,
            "charts/episodic_length": float(np.mean(lengths)) if lengths else None,
            "charts/return_recent": self.recent_return(), "episodes": self.episodes,
            "charts/learning_rate": self._learning_rate(), **stats,
        }
        self.metrics.write("learner", record)
        if self.learners_done % self.num_actors == 0:
            self._end_round()
        if self.progress is not None:
            self.progress({"env_steps": self.env_steps, "total": self.cfg.stop.env_steps,
                           "return": self.recent_return(), "updates": self.updates,
                           "steps_per_s": record["steps_per_s"],
                           "eval": self.last_eval and self.last_eval["mean_return"],
                           "dashboard": self.dashboard})

    def _end_round(self) -> None:
        """A round: one trajectory per rollout slot learned. The strategy may adapt to it."""
        reward = self.recent_return()
        m = self.actor_call("round_end", **({"reward": reward} if reward is not None else {}))
        self.metrics.write("round", {"env_steps": self.env_steps, "wall_s": self.elapsed(),
                                     "charts/return_recent": reward, **m})

    # ---- evaluation ----------------------------------------------------------------------------
    def _maybe_evaluate(self) -> None:
        if self.stop_reason is not None or self.updates == self.last_eval_updates:
            return
        if any(t.kind == "eval" for t in self.inflight.values()):
            return
        every = self.cfg.stop.eval_every_updates
        periodic = every and self.updates - max(self.last_eval_updates, 0) >= every
        recent = self.recent_return()
        at_target = (self.target is not None and recent is not None
                     and len(self.returns) >= min(RECENT_EPISODES, 5) and recent >= self.target)
        if periodic or at_target:
            self.last_eval_updates = self.updates
            self._submit_eval()

    def _submit_eval(self) -> Future:
        self.evals += 1
        fut = self.client.submit(evaluate_task, self.run_name, self.actor,
                                 self.cfg.stop.eval_episodes, 10_000 + self.evals,
                                 pure=False, key=f"evaluate-{self.evals}-{self.run_name}")
        self.inflight[fut] = _Task("eval")
        return fut

    # ---- the end -------------------------------------------------------------------------------
    def _finish(self) -> dict:
        cancelled = [f for f, t in self.inflight.items() if t.kind != "eval"]
        self._drop_pending([self.inflight[f] for f in cancelled])
        if cancelled:
            self.client.cancel(cancelled)
        self.inflight = {f: t for f, t in self.inflight.items() if t.kind == "eval"}
        self.ready.clear()
        self.replay_buffer.clear()
        if not self.supervisor.alive():
            self._recover("the parameter actor was lost at the end of the run")
        final = self.last_eval
        if self.stop_reason != "solved" or final is None:
            final = self._submit_eval().result()
            self.record_eval(final)
        return self.summary(final)


def _ema(previous: float, value: float, weight: float = 0.2) -> float:
    return value if previous == 0.0 else (1 - weight) * previous + weight * value
