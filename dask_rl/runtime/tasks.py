"""The functions Dask runs on workers: rollout, learner and evaluation tasks.

Each takes the run's name (to find its :class:`~dask_rl.runtime.plugins.RunState`) and an
:class:`~dask_rl.runtime.handle.ActorHandle` of the parameter actor, and talks to the actor itself: a Future passed to an actor method would
arrive unusable (FACTS.md), so tasks, not the driver, carry data to the actor. A rollout task's
result (a trajectory) stays in its worker's memory; the learner task that consumes it is
scheduled next to it or receives it worker-to-worker.
"""

from __future__ import annotations

import time
from typing import Any

from dask_rl.runtime.plugins import run_state
from dask_rl.types import Trajectory


def rollout_task(run: str, slot: int, actor: Any) -> Trajectory:
    """Collect ``rollout.steps`` steps on slot ``slot``'s environments with the newest policy."""
    state = run_state(run)
    rw = state.rollout_worker(slot)
    snapshot = actor.call("pull", newer_than=rw.version)
    if snapshot is not None:
        rw.load(snapshot)
    return rw.collect(state.cfg.rollout.steps)


def learner_task(run: str, traj: Trajectory, actor: Any, learner_id: str, lr: float,
                 seed: int) -> dict:
    """Pull the current version, learn from ``traj``, push the gradient; return statistics."""
    t0 = time.perf_counter()
    state = run_state(run)
    learner = state.learner()
    snapshot = actor.call("pull", learner_id=learner_id, learner_state=True)
    cross = None
    if state.cfg.learner.is_truncation:
        versions = actor.call("active_policies", exclude=learner_id)
        cross = [s for s in (actor.call("snapshot", v) for v in versions
                             if v != snapshot.version) if s is not None]
    t_pulled = time.perf_counter()
    result = learner.update(snapshot, traj, lr=lr, seed=seed, cross_policies=cross)
    t_learned = time.perf_counter()
    ack = actor.call("push", result.gradient, result.version, learner_id,
                     opt_state=result.opt_state, moments=traj.moments)
    t_pushed = time.perf_counter()
    stats = dict(result.stats)
    stats.update({
        "status": ack["status"], "staleness": ack.get("staleness", 0),
        "version_after": ack["version"], "version_pulled": snapshot.version,
        "policy_lag": snapshot.version - traj.policy_version,
        "episode_returns": traj.episode_returns.tolist(),
        "episode_lengths": traj.episode_lengths.tolist(),
        "env_steps": traj.env_steps, "trajectory_bytes": traj.nbytes,
        "rollout/collect_s": traj.collect_s,
        "learner/pull_s": t_pulled - t0, "learner/push_s": t_pushed - t_learned,
        "learner/task_s": t_pushed - t0, "cross_policies": len(cross or ()),
        "worker": state.worker.address,
    })
    return stats


def evaluate_task(run: str, actor: Any, episodes: int, seed: int) -> dict:
    """Greedy evaluation of the current version."""
    from dask_rl.rollout import evaluate

    state = run_state(run)
    snapshot = actor.call("pull")
    return evaluate(state.cfg, snapshot, episodes=episodes, seed=seed)

