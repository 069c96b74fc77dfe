"""How many workers an RL workload wants: the adaptive policy's decision, without Dask.

TianJi balances learner and rollout throughput — maximise ``min(T_learner, T_actor)``, where
TianJi's *actors* are our rollouts — and
Stellaris launches learners on demand. For one trainer, with ``r`` the seconds a rollout task
takes and ``l`` the seconds a learner task takes per trajectory (both measured by the driver):

* **rollouts** want one thread per rollout task running or waiting (the rollout backlog);
* **learners** want one thread per learner task running, plus one per ready trajectory still
  waiting for a learner, up to the learners allowed;
* **balance**: with ``n_r`` rollout threads the rollouts produce ``n_r / r`` trajectories per
  second and learners consume ``n_l / l``. Threads beyond the balanced ``n_l = n_r * l / r``
  for learners would idle for lack of data; rollout threads beyond ``n_r = n_l * r / l``
  would only grow the queue of ready trajectories. When ready trajectories pile up
  (``ready > max_learners``) the rollouts are ahead and the rollout demand is cut to what the
  learners can absorb; otherwise learners get their balanced share.
* **TianJi's allocation**, once the cluster's size limit ``M`` (threads, e.g. ``cluster.adapt``'s
  maximum) and both task times are known: the max-min linear program of
  :func:`dask_rl.control.allocation.balance` with per-slot rates ``1 / r`` and ``1 / l``
  trajectories per second and the staleness bound ``n_l <= max_learners``. It replaces the
  backlog rules above. The driver solves it (:func:`lp_allocation`), runs the allocation's
  rollout count as its rollout slots and reports the allocation with its load, so the
  scheduler sizes the cluster for exactly the allocation the driver runs.

Learners on GPUs live in their own worker group: then the CPU (default) group is sized for the
rollouts and the learner group separately. Bounds, a fixed group (the parameter actor's workers,
never scaled) and several trainers at once (population-based training) are handled here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dask_rl.control.allocation import Allocation, balance


@dataclass(frozen=True)
class Load:
    """One trainer's demand, reported by its driver and counted by the scheduler."""

    rollout_running: int = 0
    rollout_waiting: int = 0      # rollout tasks submitted but without a thread yet
    learner_running: int = 0
    learner_waiting: int = 0
    ready: int = 0                # trajectories waiting for a learner at the driver
    max_learners: int = 1
    rollout_s: float = 0.0        # mean seconds per rollout task (0: unknown)
    learner_s: float = 0.0        # mean seconds per learner task (0: unknown)
    learners_on_gpu: bool = False
    max_threads: int = 0          # the most threads the trainer's cluster may have (0: unknown)
    lp_actors: int = 0            # the driver's TianJi allocation (0: none yet)
    lp_learners: int = 0
    lp_bound: str = ""            # what bounds it: "balance" or "staleness"


@dataclass(frozen=True)
class Bounds:
    minimum: int = 1
    maximum: int = 4
    threads_per_worker: int = 1


@dataclass(frozen=True)
class Target:
    workers: int            # the default (CPU) group
    learner_workers: int    # a separate GPU learner group (0 when learners share CPU workers)
    rollout_threads: int
    learner_threads: int
    reason: str


def lp_allocation(load: Load) -> Allocation | None:
    """TianJi's allocation of ``load.max_threads`` between learners and rollouts for the
    measured task times, or None while a time or the size limit is unknown (or learners run in
    a GPU group of their own, which the rollouts' threads do not trade against)."""
    if (load.max_threads < 2 or load.rollout_s <= 0 or load.learner_s <= 0
            or load.learners_on_gpu):
        return None
    return balance(learner_rate=1.0 / load.learner_s, actor_rate=1.0 / load.rollout_s,
                   slots=load.max_threads, max_learners=load.max_learners)


def demand(load: Load) -> tuple[int, int, str]:
    """(rollout threads, learner threads, why) wanted by one trainer."""
    if load.lp_actors > 0:
        return load.lp_actors, load.lp_learners, f"lp-{load.lp_bound}"
    rollouts = load.rollout_running + load.rollout_waiting
    queue = load.learner_running + load.learner_waiting + load.ready
    learners = min(queue, load.max_learners)
    reason = "backlog"
    if load.rollout_s > 0 and load.learner_s > 0 and rollouts > 0:
        balanced_learners = math.ceil(rollouts * load.learner_s / load.rollout_s)
        if load.ready > load.max_learners:
            # rollouts are ahead: feed what the learners can absorb
            rollouts = min(rollouts, max(1, math.ceil(learners * load.rollout_s / load.learner_s)))
            reason = "learner-bound"
        else:
            learners = max(learners, min(balanced_learners, load.max_learners))
            reason = "balanced"
    return rollouts, learners, reason


def target(loads: list[Load], bounds: Bounds, *, other_tasks: int = 0) -> Target:
    """Workers wanted for these trainers (plus ``other_tasks`` threads of non-RL work)."""
    rollout = learner = gpu_learners = 0
    reasons = []
    for load in loads:
        a, lrn, why = demand(load)
        rollout += a
        if load.learners_on_gpu:
            gpu_learners += lrn
        else:
            learner += lrn
        reasons.append(why)
    threads = rollout + learner + other_tasks
    t = max(1, bounds.threads_per_worker)
    workers = min(max(math.ceil(threads / t), bounds.minimum), bounds.maximum)
    learner_workers = math.ceil(gpu_learners / t) if gpu_learners else 0
    if not loads and not other_tasks:
        reason = "idle"
    else:
        reason = ",".join(sorted(set(reasons))) or "other work"
    return Target(workers=workers, learner_workers=learner_workers, rollout_threads=rollout,
                  learner_threads=learner + gpu_learners, reason=reason)
