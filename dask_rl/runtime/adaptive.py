"""RL-aware adaptive scaling, in the scheduler: a preload.

Dask's adaptive scaling asks the scheduler how many workers it wants — ``Adaptive`` on a local
cluster through the ``adaptive_target`` RPC, the dask-kubernetes operator's ``DaskAutoscaler``
through the same RPC or ``/api/v1/adaptive_target`` (FACTS.md) — so a policy that lives in the
scheduler serves both. Loaded with ``dask scheduler --preload dask_rl.runtime.adaptive`` (dask-rl
does it for its embedded clusters), this module:

* collects the load reports drivers log every second as ``dask-rl-load`` events (rollout
  tasks in flight, ready trajectories, learners in flight, measured task times);
* answers ``adaptive_target`` with :func:`dask_rl.control.scaling.target` for the RL load while any
  driver reports one (a driver on an adaptive cluster reports TianJi's allocation, which the
  target then follows), and with Dask's own estimate otherwise (reports older than ``STALE_S``
  are ignored, so a finished run lets the cluster shrink);
* never offers a worker that holds an actor in ``workers_to_close``: adaptive scale-down would
  otherwise close the parameter actor's worker (FACTS.md); nor one of the fixed groups'
  (workers offering the ``GPU`` or ``parameter`` resource: learner jobs and pods).
"""

from __future__ import annotations

import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin

from dask_rl.control.scaling import Bounds, Load, target

logger = logging.getLogger(__name__)

LOAD_TOPIC = "dask-rl-load"
PLUGIN = "dask-rl-adaptive"
STALE_S = 10.0


class RLAdaptive(SchedulerPlugin):
    """The scheduler side of RL-aware scaling (see the module docstring)."""

    name = PLUGIN

    def __init__(self):
        self.reports: dict[str, tuple[float, dict]] = {}
        self.last_target = None

    def install(self, scheduler) -> None:
        """Take over the scheduler's adaptive target and its choice of workers to close."""
        self.scheduler = scheduler
        self.dask_target = scheduler.adaptive_target
        self.dask_workers_to_close = scheduler.workers_to_close
        scheduler.adaptive_target = self.adaptive_target
        scheduler.workers_to_close = self.workers_to_close
        scheduler.handlers["adaptive_target"] = self.adaptive_target
        scheduler.handlers["workers_to_close"] = self.workers_to_close
        scheduler.handlers["rl_adaptive_state"] = self.state

    def log_event(self, topic, msg) -> None:
        if topic == LOAD_TOPIC and isinstance(msg, dict) and "run" in msg:
            self.reports[msg["run"]] = (time.monotonic(), msg)

    def loads(self) -> list[Load]:
        now = time.monotonic()
        for run in [r for r, (t, _) in self.reports.items() if now - t > STALE_S]:
            del self.reports[run]
        return [Load(rollout_running=m.get("rollouts", 0), ready=m.get("ready", 0),
                     learner_running=m.get("learners", 0),
                     max_learners=m.get("max_learners", 1),
                     rollout_s=m.get("rollout_s", 0.0), learner_s=m.get("learner_s", 0.0),
                     learners_on_gpu=bool(m.get("gpu", False)),
                     lp_actors=m.get("lp_actors", 0), lp_learners=m.get("lp_learners", 0),
                     lp_bound=m.get("lp_bound", ""))
                for _, m in self.reports.values()]

    def adaptive_target(self, target_duration=None) -> int:
        loads = self.loads()
        if not loads:
            return self.dask_target(target_duration)
        workers = list(self.scheduler.workers.values())
        threads = round(sum(w.nthreads for w in workers) / len(workers)) if workers else 1
        rl = target(loads, Bounds(minimum=0, maximum=10**6, threads_per_worker=threads))
        self.last_target = rl
        return max(rl.workers, 1)

    def workers_to_close(self, *args, **kwargs) -> list:
        proposed = self.dask_workers_to_close(*args, **kwargs)
        # an actor's worker, and the fixed groups' (GPU learners, the parameter group)
        held = [ws for ws in self.scheduler.workers.values()
                if ws.actors or ws.resources.get("GPU") or ws.resources.get("parameter")]
        keep = {ws.address for ws in held} | {ws.name for ws in held}
        spared = [w for w in proposed if w in keep]
        if spared:
            logger.info("not closing %s: it holds an actor or is in a fixed group", spared)
        return [w for w in proposed if w not in keep]

    def state(self) -> dict:
        """What the policy sees and decides (for tests and debugging)."""
        t = self.last_target
        return {"runs": sorted(self.reports), "target": self.adaptive_target(),
                "learner_workers": t.learner_workers if t else 0,
                "rollout_threads": t.rollout_threads if t else 0,
                "learner_threads": t.learner_threads if t else 0,
                "reason": t.reason if t else "no RL load"}


def dask_setup(scheduler) -> None:
    """Called by Dask when the scheduler starts with this preload."""
    if PLUGIN not in scheduler.plugins:
        plugin = RLAdaptive()
        plugin.install(scheduler)
        scheduler.add_plugin(plugin, name=PLUGIN)
