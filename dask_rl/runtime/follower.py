"""Rollout slots follow the cluster: the driver's part that watches workers come and go, solves
TianJi's allocation on an adaptive cluster, tells the scheduler what the run wants, and says
why nothing finishes when workers are paused for memory (or ends a run nothing can advance).

Its duties are periodic (:meth:`ClusterFollower.rescale` every second,
:meth:`~ClusterFollower.allocate` every ``ALLOCATE_EVERY_S``, :meth:`~ClusterFollower.report`
every second); the driver's timer table calls them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dask_rl.control.allocation import worth_changing
from dask_rl.control.scaling import Load, lp_allocation
from dask_rl.runtime.adaptive import LOAD_TOPIC
from dask_rl.runtime.cluster import place_slots

logger = logging.getLogger(__name__)

ALLOCATE_EVERY_S = 5.0  # how often TianJi's allocation is solved again on an adaptive cluster


class ClusterFollower:
    """Rollout slots, their placement, and the run's load for the scheduler's adaptive policy.

    ``run`` is the driver: its ``client``, ``cfg``, ``policy`` (the launch policy, resized
    here), ``accounting`` (task times), ``metrics`` and counters. ``sized`` is False for
    replay learners, which TianJi's allocation does not size yet
    (:mod:`dask_rl.control.allocation`).
    """

    def __init__(self, run: Any, *, sized: bool = True):
        self.run = run
        self.sized = sized
        self.slot_workers: dict[int, str] = {}
        self.known_workers: set[str] = set()
        self.allocation = None      # TianJi's allocation, on adaptive clusters
        self.last_progress = time.monotonic()  # when a task last finished (the stall watchdog)

    def start(self) -> int:
        """Slots for the cluster as it is now: ``rollout.slots``, or one per worker thread."""
        run = self.run
        threads = sum(run.client.nthreads().values())
        slots = run.cfg.rollout.slots or threads
        self._place(slots)
        self.known_workers = set(run.client.nthreads())
        return slots

    def placement(self, slot: int) -> dict:
        """Where slot ``slot``'s rollouts should run (its worker, others allowed)."""
        where = self.slot_workers.get(slot)
        return {"workers": [where], "allow_other_workers": True} if where else {}

    def _place(self, slots: int) -> None:
        self.run.policy.resize(slots)
        self.slot_workers = place_slots(self.run.client, slots)

    def rescale(self) -> None:
        """Follow the cluster as workers come and go (adaptive scaling, failures).

        Rollout slots are spread over the current workers again, and, unless
        ``rollout.slots`` fixes it, there is one slot per worker thread (on an adaptive
        cluster, once task times are measured, as many as TianJi's allocation gives the
        actors: :meth:`allocate`). Learners follow on their own: one is launched per completed
        trajectory, so more slots mean more learners, up to ``learner.max_learners``
        (Stellaris' orchestration).
        """
        run = self.run
        nthreads = run.client.nthreads()
        if not nthreads or set(nthreads) == self.known_workers:
            return
        self.known_workers = set(nthreads)
        old = run.policy.slots
        new = (run.cfg.rollout.slots or (self.allocation.actors if self.allocation else 0)
               or sum(nthreads.values()))
        self._place(new)
        run.metrics.write("rescale", {"slots": new, "previous": old, "workers": len(nthreads),
                                      "env_steps": run.env_steps})
        logger.info("%d workers: %d rollout slots", len(nthreads), new)

    def max_threads(self) -> int:
        """The most threads this run may get: ``cluster.adapt``'s maximum workers times the
        threads per worker; 0 on a fixed cluster, with ``rollout.slots`` fixed, or when the
        allocation does not size this run."""
        cfg = self.run.cfg
        adapt = cfg.cluster.adapt
        if adapt is None or cfg.rollout.slots or not self.sized:
            return 0
        nthreads = list(self.run.client.nthreads().values()) or [cfg.cluster.threads_per_worker]
        return adapt.maximum * max(1, round(sum(nthreads) / len(nthreads)))

    def load(self) -> Load:
        """What this run wants, as the scheduler's adaptive policy sees it."""
        run = self.run
        a, acc, policy = self.allocation, run.accounting, run.policy
        return Load(rollout_running=policy.rollouts_in_flight, ready=len(policy.ready),
                    learner_running=policy.learners_in_flight,
                    max_learners=run.cfg.learner.max_learners,
                    rollout_s=acc.rollout_cycle_s or acc.rollout_s,
                    learner_s=acc.learner_cycle_s or acc.learner_s,
                    learners_on_gpu=run.cfg.learner.gpus > 0, max_threads=self.max_threads(),
                    lp_actors=a.actors if a else 0, lp_learners=a.learners if a else 0,
                    lp_bound=a.bound if a else "")

    def report(self) -> None:
        """Tell the scheduler's adaptive policy what this run wants."""
        load = self.load()
        self.run.events.send(LOAD_TOPIC, {
            "run": self.run.run_name, "rollouts": load.rollout_running, "ready": load.ready,
            "learners": load.learner_running, "max_learners": load.max_learners,
            "rollout_s": load.rollout_s, "learner_s": load.learner_s,
            "gpu": load.learners_on_gpu, "lp_actors": load.lp_actors,
            "lp_learners": load.lp_learners, "lp_bound": load.lp_bound,
            "time": time.monotonic()})

    def allocate(self) -> None:
        """TianJi's allocation on an adaptive cluster: solve the max-min LP for the measured
        task times and run its actor count as rollout slots; the load report carries it to
        the scheduler, which sizes the cluster for it. Each change is an ``allocation``
        record (shown on the ``/rl`` page)."""
        run = self.run
        load = self.load()
        a = lp_allocation(load)
        if a is None:
            return
        if not worth_changing(self.allocation, a, learner_rate=1.0 / load.learner_s,
                              actor_rate=1.0 / load.rollout_s, slots=load.max_threads,
                              max_learners=load.max_learners):
            return
        self.allocation = a
        run.metrics.write("allocation", {
            "actors": a.actors, "learners": a.learners, "bound": a.bound,
            "lp_actors": a.lp_actors, "lp_learners": a.lp_learners,
            "actor_rate": a.actor_rate, "learner_rate": a.learner_rate,
            "rollout_s": load.rollout_s, "learner_s": load.learner_s,
            "max_threads": load.max_threads, "env_steps": run.env_steps,
            "wall_s": run.elapsed()})
        logger.info("TianJi allocation: %d rollout slots, %d learners (%s-bound; %.2f s per "
                    "rollout, %.2f s per learner task)", a.actors, a.learners, a.bound,
                    load.rollout_s, load.learner_s)
        if a.actors != run.policy.slots:
            self._place(a.actors)

    def check_resources(self) -> None:
        """A run whose learners need GPUs stops at once, in one line, on a cluster without."""
        gpus = self.run.cfg.learner.gpus
        if gpus <= 0:
            return
        have = self.run.client.run_on_scheduler(
            lambda dask_scheduler: [w.resources.get("GPU", 0)
                                    for w in dask_scheduler.workers.values()])
        if not any(g >= gpus for g in have):
            raise RuntimeError(
                f"learner.gpus is {gpus:g} but no worker offers a GPU resource of that size "
                f"(workers offer {have or 'nothing'}); start workers with --resources GPU=1 or "
                f"set learner.gpus: 0")

    def watch_stall(self, progressed: bool, in_flight: int) -> None:
        """Degrade instead of stalling: when nothing finished for ``checkpoint.stall_s`` while
        tasks are in flight, say why (workers paused for memory run nothing); when every
        worker is paused, nothing ever will: end the run with one line."""
        now = time.monotonic()
        run = self.run
        if progressed or not in_flight:
            self.last_progress = now
            return
        stalled = now - self.last_progress
        if stalled < run.cfg.checkpoint.stall_s:
            return
        workers = run.client.scheduler_info(n_workers=-1)["workers"]
        paused = [a for a, w in workers.items() if w.get("status") == "paused"]
        if workers and len(paused) == len(workers):
            limit = min(w.get("memory_limit") or 0 for w in workers.values()) / 2**30
            raise run.fail(
                f"no task finished in {stalled:.0f} s: all {len(workers)} workers are paused "
                f"for memory (limit {limit:.1f} GiB each); give them more memory "
                f"(cluster.memory_limit, bigger pods) or use fewer env.num_envs", "stalled")
        logger.warning("no task finished in %.0f s with %d in flight (%d of %d workers paused "
                       "for memory)", stalled, in_flight, len(paused), len(workers))
        run.metrics.write("stall", {"seconds": stalled, "in_flight": in_flight,
                                    "paused_workers": len(paused), "workers": len(workers)})
        self.last_progress = now
