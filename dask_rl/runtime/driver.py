"""The driver: the run loop of an asynchronous trainer (PPO, IMPACT) on a Dask cluster.

It keeps ``rollout.num_actors`` rollout tasks in flight, launches a learner task on each
trajectory as it completes (Stellaris' on-demand learners, at most ``learner.max_learners`` at
once), evaluates greedily, checkpoints, and stops. Trajectories never come to the client: the
driver only holds their futures, and learner tasks return a few statistics. Off-policy
algorithms (IMPACT, ``algo.replay > 1``) keep the futures of recent trajectories in a circular
buffer and replay each up to ``replay`` times when learners would otherwise idle — the data
stays on its worker.

Rollouts and learners never wait for each other, unless the aggregation strategy is
``synchronous``: then rollouts run in rounds, each round on the version the previous round's
update produced. A trajectory completed while ``rollout.max_ready`` are already waiting pauses
its rollout slot until learners catch up (backpressure instead of an unbounded queue).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
from distributed import Client, Future, wait

from dask_rl.checkpoint import CheckpointStore
from dask_rl.config import PipelineConfig, to_dict
from dask_rl.envs import env_spaces, reward_threshold
from dask_rl.metrics import MetricsLog
from dask_rl.models import get_flat, make_model
from dask_rl.models.normalizer import empty_moments
from dask_rl.runtime.cluster import place_slots
from dask_rl.runtime.handle import ActorHandle
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.runtime.plugins import RunState, register_torch_sizeof
from dask_rl.runtime.tasks import evaluate_task, learner_task, rollout_task
from dask_rl.staleness import STRATEGIES

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 5
RECENT_EPISODES = 20


@dataclasses.dataclass
class _Task:
    kind: str                 # "rollout" | "learner" | "eval"
    slot: int = -1
    learner_id: str = ""
    trajectory: Future | None = None
    first_use: bool = True    # learner: the trajectory's first learning (not a replay)


class Driver:
    """Runs one pipeline on a connected client; :meth:`run` returns the summary.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    cfg
        The validated pipeline.
    run_dir
        Where ``summary.json``, ``metrics.jsonl`` and ``checkpoints/`` go.
    progress
        Called with a small dict after every learner result (the CLI's progress bar).
    """

    def __init__(self, client: Client, cfg: PipelineConfig, run_dir: str | os.PathLike, *,
                 progress: Callable[[dict], None] | None = None, resume: bool = False):
        self.client = client
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.resume = resume
        self.run_name = f"dask-rl-{uuid.uuid4().hex[:8]}"
        self.synchronous = STRATEGIES[cfg.aggregation.strategy].synchronous
        self.target = (cfg.stop.target_return if cfg.stop.target_return is not None
                       else reward_threshold(cfg.env.id))
        # counters (checkpointed)
        self.env_steps = 0
        self.env_steps_learned = 0
        self.updates = 0
        self.learner_seq = 0
        self.rollout_seq = 0
        self.evals = 0
        self.wall_offset = 0.0
        self.best_return: float | None = None
        self.last_eval: dict | None = None
        self.recoveries = 0
        self.learners_done = 0
        # live state
        self.inflight: dict[Future, _Task] = {}
        self.ready: collections.deque[Future] = collections.deque()
        self.replay = getattr(cfg.algo, "replay", 1)
        # circular buffer of (trajectory future, times learned), newest last
        self.replay_buffer: collections.deque[list] = collections.deque(
            maxlen=getattr(cfg.algo, "buffer_size", 1))
        self.idle_slots: list[int] = []
        self.returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        self.episodes = 0
        self.failures = collections.Counter()
        self.dropped_trajectories = 0
        self.learner_busy_s = 0.0
        self.rollout_busy_s = 0.0
        self.trajectory_bytes = 0
        self.stop_reason: str | None = None
        self.draining = False
        self.last_eval_updates = -1
        self.last_checkpoint = 0.0

    # ---- set-up --------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        register_torch_sizeof()
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", client=self.client,
                                  run=self.run_name)
        self.store = CheckpointStore(cfg.checkpoint.path or self.run_dir / "checkpoints",
                                     keep=cfg.checkpoint.keep)
        obs_space, action_space = env_spaces(cfg.env)
        model = make_model(obs_space, action_space, cfg.model,
                           normalize_obs=cfg.env.normalize_obs, seed=cfg.seed)
        params = get_flat(model)
        self.num_params = len(params)
        moments = {}
        if cfg.env.normalize_obs:
            moments["obs"] = empty_moments(int(np.prod(obs_space.shape)))
        if cfg.env.normalize_reward:
            moments["return"] = empty_moments(1)
        self._check_resources()
        self.client.register_plugin(RunState(self.run_name, cfg), name=self.run_name)
        keep = 4 * cfg.learner.max_learners if cfg.learner.is_truncation else 0
        self.actor = ActorHandle(self.client.submit(
            ParameterActor, params, cfg.aggregation, moments=moments, keep_versions=keep,
            learners=cfg.learner.max_learners,
            target_every=getattr(cfg.algo, "target_update_every", None), actor=True, pure=False,
            key=f"parameter-actor-{self.run_name}").result())
        if self.resume:
            self._restore()
        threads = sum(self.client.nthreads().values())
        self.num_actors = cfg.rollout.num_actors or threads
        self.slot_workers = place_slots(self.client, self.num_actors)
        self.last_rescale = time.time()
        logger.info("run %s: %d rollout slots, %d learners max, %d worker threads, %s",
                    self.run_name, self.num_actors, cfg.learner.max_learners, threads,
                    cfg.aggregation.strategy)

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

    def _restore(self) -> None:
        state, meta, name = self.store.load_latest_good(
            expect={"algorithm": self.cfg.algo.name, "env_id": self.cfg.env.id,
                    "num_params": self.num_params})
        self.actor.call("load_state_dict", state["actor"])
        d = state["driver"]
        self.env_steps = self.env_steps_learned = int(d["env_steps"])
        self.updates = int(state["actor"]["version"])
        self.learner_seq = int(d["learner_seq"])
        self.rollout_seq = int(d["rollout_seq"])
        self.evals = int(d["evals"])
        self.wall_offset = float(d["wall_s"])
        self.best_return = d.get("best_return")
        self.recoveries = int(d.get("recoveries", 0))
        self.episodes = int(d.get("episodes", 0))
        self.returns.extend(d.get("recent_returns", []))
        logger.info("resumed from %s at %d env steps, version %d", name, self.env_steps,
                    self.updates)
        self.metrics.write("resume", {"checkpoint": name, "env_steps": self.env_steps,
                                      "updates": self.updates})

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train until a stop condition holds; returns the summary (also in summary.json)."""
        self.t0 = time.time()
        self._setup()
        try:
            self.metrics.write("run", {"event": "start", "config": to_dict(self.cfg),
                                       "num_actors": self.num_actors})
            for slot in range(self.num_actors):
                self._submit_rollout(slot)
            self.last_checkpoint = time.time()
            while not self._finished():
                for fut in self._wait_some(0.5):
                    self._handle(fut, self.inflight.pop(fut))
                self._check_stop()
                self._rescale()
                self._refill()
                self._maybe_evaluate()
                self._maybe_checkpoint()
            return self._finish()
        finally:
            self._teardown()

    def _wait_some(self, timeout: float) -> list[Future]:
        """Futures that completed within ``timeout`` seconds (possibly none)."""
        try:
            done, _ = wait(list(self.inflight), timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        return list(done)

    def elapsed(self) -> float:
        return time.time() - self.t0 + self.wall_offset

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
        stop = self.cfg.stop
        if self.env_steps >= stop.env_steps:
            self.stop_reason, self.draining = "env_steps", True
        elif stop.wall_s is not None and self.elapsed() >= stop.wall_s:
            self.stop_reason = "wall_s"

    def _handle(self, fut: Future, task: _Task) -> None:
        if fut.status != "finished":
            self._failed(fut, task)
            return
        self.failures[task.kind] = 0
        if task.kind == "rollout":
            self.env_steps += self.cfg.batch_size
            self.ready.append(fut)
            if task.slot < self.num_actors:
                self.idle_slots.append(task.slot)
        elif task.kind == "learner":
            self._on_learner(fut.result(), first_use=task.first_use)
        elif task.kind == "eval":
            self._on_eval(fut.result())

    def _failed(self, fut: Future, task: _Task) -> None:
        exc = fut.exception() if fut.status == "error" else None
        self.failures[task.kind] += 1
        logger.warning("%s task %s: %s", task.kind, fut.status, exc)
        if self.failures[task.kind] >= MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self.failures[task.kind]} {task.kind} tasks failed in a row; "
                               f"last error: {exc!r}") from exc
        if task.kind == "rollout":
            self.idle_slots.append(task.slot)
        elif task.kind == "learner":
            self.actor.submit("learner_lost", task.learner_id)

    # ---- launching -----------------------------------------------------------------------------
    def _rescale(self) -> None:
        """Follow the cluster: one rollout slot per worker thread (unless fixed by config).

        Learners follow on their own: one is launched per completed trajectory, so more slots
        mean more learners, up to ``learner.max_learners`` (Stellaris' orchestration).
        """
        if self.cfg.rollout.num_actors is not None or time.time() - self.last_rescale < 1.0:
            return
        self.last_rescale = time.time()
        threads = sum(self.client.nthreads().values())
        if threads == 0 or threads == self.num_actors:
            return
        old = self.num_actors
        self.num_actors = threads
        self.slot_workers = place_slots(self.client, threads)
        if threads > old:
            self.idle_slots.extend(range(old, threads))
        # Slots beyond the new count are retired: their tasks finish, they are not resubmitted.
        self.idle_slots = [s for s in self.idle_slots if s < threads]
        self.metrics.write("rescale", {"slots": threads, "previous": old,
                                       "env_steps": self.env_steps})
        logger.info("cluster now has %d worker threads: %d rollout slots", threads, threads)

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
        fut = self.client.submit(rollout_task, self.run_name, slot, self.actor, pure=False,
                                 key=f"rollout-{slot}-{self.rollout_seq}-{self.run_name}",
                                 workers=[where] if where else None, allow_other_workers=True)
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
            fut = self.client.submit(learner_task, self.run_name, traj, self.actor, lid,
                                     self._learning_rate(), seed, pure=False,
                                     key=f"learner-{lid}-{self.run_name}", **kwargs)
            self.inflight[fut] = _Task("learner", learner_id=lid, trajectory=traj,
                                       first_use=first_use)
            running += 1

    def _learning_rate(self) -> float:
        cfg = self.cfg.learner
        if not cfg.anneal_lr:
            return cfg.lr
        frac = 1.0 - self.env_steps_learned / self.cfg.stop.env_steps
        return cfg.lr * max(frac, 0.01)

    # ---- results -------------------------------------------------------------------------------
    def _on_learner(self, stats: dict, first_use: bool = True) -> None:
        self.updates = max(self.updates, stats["version_after"])
        self.learner_busy_s += stats["learner/task_s"]
        returns = stats.pop("episode_returns")
        lengths = stats.pop("episode_lengths")
        if first_use:  # a replay learns from the same steps and episodes again
            self.env_steps_learned += stats["env_steps"]
            self.rollout_busy_s += stats["rollout/collect_s"]
            self.trajectory_bytes += stats["trajectory_bytes"]
            self.returns.extend(returns)
            self.episodes += len(returns)
        else:
            returns, lengths = [], []
        stats["replay"] = not first_use
        self.learners_done += 1
        record = {
            "env_steps": self.env_steps, "env_steps_learned": self.env_steps_learned,
            "updates": self.updates, "wall_s": self.elapsed(),
            "steps_per_s": self.env_steps / max(self.elapsed() - self.wall_offset, 1e-9),
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
                           "eval": self.last_eval and self.last_eval["mean_return"]})

    def _end_round(self) -> None:
        """A round: one trajectory per rollout slot learned. The strategy may adapt to it."""
        reward = self.recent_return()
        m = self.actor.call("round_end", **({"reward": reward} if reward is not None else {}))
        self.metrics.write("round", {"env_steps": self.env_steps, "wall_s": self.elapsed(),
                                     "charts/return_recent": reward, **m})

    def recent_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

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

    def _on_eval(self, result: dict) -> None:
        self.last_eval = result
        ret = result["mean_return"]
        self.best_return = ret if self.best_return is None else max(self.best_return, ret)
        self.metrics.write("eval", {"env_steps": self.env_steps, "updates": self.updates,
                                    "wall_s": self.elapsed(), **result})
        logger.info("greedy evaluation at %d steps (version %d): %.1f", self.env_steps,
                    result["version"], ret)
        if (self.cfg.stop.solve_on_target and self.target is not None and ret >= self.target
                and self.stop_reason is None):
            self.stop_reason = "solved"

    # ---- checkpoints ---------------------------------------------------------------------------
    def _maybe_checkpoint(self) -> None:
        every = self.cfg.checkpoint.every_s
        if every > 0 and time.time() - self.last_checkpoint >= every:
            self.checkpoint()

    def checkpoint(self) -> str:
        """Write the actor's and the driver's state as one checkpoint now."""
        t0 = time.perf_counter()
        actor_state = self.actor.call("state_dict")
        driver = {"env_steps": self.env_steps_learned, "learner_seq": self.learner_seq,
                  "rollout_seq": self.rollout_seq, "evals": self.evals,
                  "wall_s": self.elapsed(), "best_return": self.best_return,
                  "recoveries": self.recoveries, "episodes": self.episodes,
                  "recent_returns": list(self.returns)}
        meta = {"algorithm": self.cfg.algo.name, "env_id": self.cfg.env.id,
                "config": to_dict(self.cfg), "env_steps": self.env_steps_learned,
                "updates": actor_state["version"], "time": time.time()}
        name = self.store.save({"actor": actor_state, "driver": driver}, meta=meta)
        self.last_checkpoint = time.time()
        seconds = time.perf_counter() - t0
        self.metrics.write("checkpoint", {"name": name, "seconds": seconds,
                                          "env_steps": self.env_steps,
                                          "updates": actor_state["version"]})
        return name

    # ---- the end -------------------------------------------------------------------------------
    def _finish(self) -> dict:
        cancelled = [f for f, t in self.inflight.items() if t.kind != "eval"]
        self.dropped_trajectories += len(self.ready) + sum(
            self.inflight[f].kind == "rollout" for f in cancelled)
        if cancelled:
            self.client.cancel(cancelled)
        self.inflight = {f: t for f, t in self.inflight.items() if t.kind == "eval"}
        self.ready.clear()
        self.replay_buffer.clear()
        final = self.last_eval
        if self.stop_reason != "solved" or final is None:
            final = self._submit_eval().result()
            self._on_eval(final)
        actor_metrics = self.actor.call("metrics")
        self.checkpoint()
        wall = self.elapsed()
        threads = sum(self.client.nthreads().values())
        summary = {
            "algorithm": self.cfg.algo.name, "env_id": self.cfg.env.id,
            "strategy": self.cfg.aggregation.strategy,
            "env_steps": self.env_steps, "env_steps_learned": self.env_steps_learned,
            "updates": actor_metrics["version"], "wall_s": wall,
            "steps_per_s": self.env_steps / max(wall - self.wall_offset, 1e-9),
            "final_return": final["mean_return"], "final_return_std": final["std_return"],
            "best_return": self.best_return, "target_return": self.target,
            "solved": self.target is not None and final["mean_return"] >= self.target,
            "stop_reason": self.stop_reason,
            "staleness_mean": actor_metrics["staleness/mean"],
            "staleness_max": actor_metrics["staleness/max"],
            "gradients_applied": actor_metrics["gradients/applied"],
            "gradients_dropped": actor_metrics["gradients/dropped"],
            "gradients_rejected": actor_metrics["gradients/rejected"],
            "recoveries": self.recoveries, "episodes": self.episodes,
            "dropped_trajectories": self.dropped_trajectories,
            "trajectory_bytes": self.trajectory_bytes,
            "learner_time_share": self.learner_busy_s / max(wall * threads, 1e-9),
            "rollout_time_share": self.rollout_busy_s / max(wall * threads, 1e-9),
            "actor_apply_share": actor_metrics["actor/apply_s"] / max(wall, 1e-9),
            "worker_threads": threads, "num_actors": self.num_actors, "run": self.run_name,
        }
        self.metrics.write("run", {"event": "end", **summary})
        return summary

    def _teardown(self) -> None:
        try:
            if self.inflight:
                self.client.cancel(list(self.inflight))
            self.client.unregister_worker_plugin(self.run_name)
        except Exception:
            logger.debug("teardown", exc_info=True)
        if hasattr(self, "metrics"):
            self.metrics.close()
