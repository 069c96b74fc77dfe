"""The functions Dask runs on workers: rollout, learner and evaluation tasks.

Each takes the run's name (to find its :class:`~dask_rl.runtime.plugins.RunState`) and an
:class:`~dask_rl.runtime.handle.ActorHandle` of the parameter actor, and talks to the actor
itself: a Future passed to an actor method would arrive unusable (FACTS.md), so tasks, not the
driver, carry data to the actor. A rollout task's result (a trajectory) stays in its worker's
memory; the learner task that consumes it is scheduled next to it or receives it
worker-to-worker.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_rl.data import (
    ESStep,
    Evaluation,
    LearnerReport,
    PerturbationResult,
    PushAck,
    Trajectory,
    TrajectoryStats,
)
from dask_rl.runtime.plugins import run_state

if TYPE_CHECKING:
    from dask_rl.algos.replay import Transitions


def rollout_task(run: str, slot: int, actor: Any, exploration: float | None = None
                 ) -> Trajectory:
    """Collect ``rollout.steps`` steps on slot ``slot``'s environments with the newest policy
    (acting as a replay algorithm does with ``exploration``, e.g. DQN's epsilon).

    TianJi's event-triggered pull: the slot asks the parameter actor only every
    ``rollout.pull_every`` rollouts, and the parameters move only when the actor's version
    moved by ``rollout.pull_min_versions`` or more (a slot without a policy from this very
    actor always pulls)."""
    return _collect(run_state(run), slot, actor, exploration)


def _collect(state: Any, slot: int, actor: Any, exploration: float | None = None
             ) -> Trajectory:
    t_wait = time.perf_counter()
    with state.slot_lock(slot):
        t0 = time.perf_counter()
        traj = collect_held(state, slot, actor, exploration, t0)
    traj.slot_wait_s = t0 - t_wait
    return traj


def collect_held(state: Any, slot: int, actor: Any, exploration: float | None, t0: float
                 ) -> Trajectory:
    """A rollout on slot ``slot`` once its environments are held (``t0``: when): pull if
    due, collect."""
    rollout = state.cfg.rollout
    collector = state.collector(slot)
    # A re-created actor restarts from an older version: a cached version only counts if it
    # came from this very actor.
    held = collector.version if collector.source == actor.key else -1
    if held < 0 or collector.rollouts_since_pull + 1 >= rollout.pull_every:
        snapshot = actor.call("pull", newer_than=held, min_versions=rollout.pull_min_versions,
                              slot=slot)
        collector.rollouts_since_pull = 0
        if snapshot is not None:
            collector.load(snapshot, source=actor.key)
    else:
        collector.rollouts_since_pull += 1
    pull_s = time.perf_counter() - t0
    traj = collector.collect(rollout.steps, exploration=exploration)
    traj.pull_s = pull_s
    return traj


def trajectory_stats_task(traj: Trajectory) -> TrajectoryStats:
    """A replayed run's counts of a finished rollout, computed where it lies: the driver
    counts env steps and episodes without the data coming to it."""
    return TrajectoryStats(env_steps=traj.env_steps, steps=traj.num_steps, envs=traj.num_envs,
                           episode_returns=traj.episode_returns.tolist(),
                           episode_lengths=traj.episode_lengths.tolist(),
                           policy_version=traj.policy_version, nbytes=traj.nbytes,
                           collect_s=traj.collect_s)


def sample_task(run: str, trajectories: list[Trajectory],
                rows: list[tuple[np.ndarray, np.ndarray]]) -> Transitions:
    """The replay algorithm's transitions at rows ``(t, i)`` of each trajectory, cut on the
    worker that holds them (TianJi's replay: only the sampled rows move to the learner). Atari
    rewards are sign-clipped, as the learners of every algorithm see them."""
    from dask_rl.algos.replay import Transitions as T
    from dask_rl.envs import is_atari

    state = run_state(run)
    clip = is_atari(state.cfg.env) and state.cfg.env.clip_rewards
    algorithm = state.algorithm()
    return T.concat([algorithm.sample(traj, t, i, rewards=np.sign(traj.rewards) if clip else None)
                     for traj, (t, i) in zip(trajectories, rows)])


def replay_learner_task(run: str, samples: list[Transitions], actor: Any, learner_id: str,
                        lr: float, batch_size: int, seed: int,
                        seq: int | None = None) -> LearnerReport:
    """Pull the current version and target network, take a gradient step per ``batch_size``
    sampled transitions, push the delta (exactly once, by ``seq``); return a report."""
    from dask_rl.algos.replay import Transitions as T

    t0 = time.perf_counter()
    state = run_state(run)
    learner = state.learner()
    snapshot = _admitted_pull(actor, learner_id, state.cfg)
    t_pulled = time.perf_counter()
    batch = T.concat(samples)
    update = learner.update_transitions(snapshot, batch, lr=lr, batch_size=batch_size,
                                        seed=seed)
    t_learned = time.perf_counter()
    ack = actor.call("push", update.delta, update.version, learner_id,
                     opt_state=update.opt_state, finite_loss=update.finite, seq=seq,
                     epoch=actor.epoch, run=run)
    t_pushed = time.perf_counter()
    nbytes = batch.nbytes
    return LearnerReport(
        ack=ack, version_pulled=snapshot.version, policy_lag=0, episode_returns=[],
        episode_lengths=[], trajectory_steps=0, trajectory_bytes=nbytes, collect_s=0.0,
        pull_s=t_pulled - t0, push_s=t_pushed - t_learned, task_s=t_pushed - t0,
        cross_policies=0, worker=state.worker.address, stats=update.stats)


def learner_task(run: str, traj: Trajectory, actor: Any, learner_id: str, lr: float,
                 seed: int, algo_overrides: dict | None = None,
                 first_use: bool = True, seq: int | None = None) -> LearnerReport:
    """Pull the current version, learn from ``traj``, push the delta; return a report.

    A replayed trajectory (``first_use`` False) pushes no observation/return statistics: they
    were merged when it was first learned from. ``seq``, the task's sequence number in the run,
    makes the push exactly-once: if Dask runs this task again (its worker died after the push),
    the actor refuses the second push.
    """
    return _learn(run, run_state(run), traj, actor, learner_id, lr, seed, algo_overrides,
                  first_use, seq)


def collect_and_learn_task(run: str, slot: int, actor: Any, learner_id: str, lr: float,
                           seed: int, algo_overrides: dict | None = None,
                           seq: int | None = None) -> LearnerReport:
    """A learner fed where its data is: collect on slot ``slot`` (as :func:`rollout_task`),
    then learn from that trajectory here (as :func:`learner_task`, its first use), with no
    trip to the driver between the two and no trajectory leaving this worker.

    A task queued behind its slot's running one is sent to the slot's worker at once and
    starts there when a thread is free; if it finds the slot's environments still busy (a
    worker with more threads), it waits for them (:meth:`RunState.slot_lock`). Not a Dask
    dependency on the previous task: a chain of dependencies keeps every task of the chain
    in the scheduler for the whole run."""
    state = run_state(run)
    traj = _collect(state, slot, actor)
    return _learn(run, state, traj, actor, learner_id, lr, seed, algo_overrides, True, seq)


def _learn(run: str, state: Any, traj: Trajectory, actor: Any, learner_id: str, lr: float,
           seed: int, algo_overrides: dict | None, first_use: bool, seq: int | None
           ) -> LearnerReport:
    t0 = time.perf_counter()
    snapshot = _admitted_pull(actor, learner_id, state.cfg)
    return learn_pulled(run, state, snapshot, traj, actor, learner_id, lr, seed, algo_overrides,
                        first_use, seq, t0=t0)


def learn_pulled(run: str, state: Any, snapshot: Any, traj: Trajectory, actor: Any,
                 learner_id: str, lr: float, seed: int, algo_overrides: dict | None,
                 first_use: bool, seq: int | None, *, t0: float) -> LearnerReport:
    """A learner task after its pull (``t0``: when the pull began): learn from ``traj`` on
    ``snapshot``, push the delta, report. The virtual-time cluster
    (:mod:`dask_rl.virtual`) calls it at the moment its clock says the learner ends."""
    learner = state.learner()
    t_pulled = time.perf_counter()
    exchange = None
    if state.cfg.learner.is_truncation:
        def exchange(params):
            return actor.call("exchange", learner_id, params)
    update = learner.update(snapshot, traj, lr=lr, seed=seed, exchange=exchange,
                            algo_overrides=algo_overrides)
    t_learned = time.perf_counter()
    ack = actor.call("push", update.delta, update.version, learner_id,
                     opt_state=update.opt_state, moments=traj.moments if first_use else None,
                     finite_loss=update.finite, seq=seq, epoch=actor.epoch, run=run,
                     samples=traj.env_steps,
                     sample_lag=max(0, snapshot.version - traj.policy_version))
    t_pushed = time.perf_counter()
    return LearnerReport(
        ack=ack, version_pulled=snapshot.version,
        policy_lag=snapshot.version - traj.policy_version,
        episode_returns=traj.episode_returns.tolist(),
        episode_lengths=traj.episode_lengths.tolist(),
        trajectory_steps=traj.env_steps, trajectory_bytes=traj.nbytes,
        collect_s=traj.collect_s, pull_s=t_pulled - t0, push_s=t_pushed - t_learned,
        task_s=t_pushed - t0, cross_policies=int(update.stats.get("learner/cross_policies", 0)),
        worker=state.worker.address, stats=update.stats, rollout_pull_s=traj.pull_s,
        slot_wait_s=traj.slot_wait_s)


def _admitted_pull(actor: Any, learner_id: str, cfg: Any):
    """Pull as a learner, waiting while the strategy does not admit one yet (SSP); the Adam
    moments come along only if the actor keeps them (``learner.optimizer_state``)."""
    timeout = cfg.checkpoint.actor_timeout_s
    shared = cfg.learner.optimizer_state == "shared"
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        snapshot = actor.call("pull_learner", learner_id, opt_state=shared)
        if snapshot is not None:
            return snapshot
        if time.monotonic() > deadline:
            raise TimeoutError(f"learner {learner_id} was not admitted within {timeout} s")
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def evaluate_task(run: str, actor: Any, episodes: int, seed: int) -> Evaluation:
    """Greedy evaluation of the current version."""
    from dask_rl.roles.evaluation import evaluate

    state = run_state(run)
    snapshot = actor.call("pull")
    return evaluate(state.cfg, snapshot, episodes=episodes, seed=seed)


def write_replay_task(url: str, index: int, traj: Trajectory) -> dict[str, int]:
    """Write a replay-buffer trajectory into a pending checkpoint, from its worker; the
    checksums of what it wrote."""
    from dask_rl.checkpoint import write_trajectory

    return write_trajectory(url, index, traj)


def read_replay_task(url: str, index: int, checksums: dict[str, int] | None = None
                     ) -> Trajectory:
    """Read a checkpointed replay-buffer trajectory back into worker memory."""
    from dask_rl.checkpoint import read_trajectory

    return read_trajectory(url, index, checksums)


def es_evaluate_task(run: str, actor: Any, version: int, indices,
                     seeds) -> PerturbationResult:
    """Evaluate antithetic pairs around the mean parameters of ``version``: scalars back."""
    w = run_state(run).es_evaluator()
    if w.source != actor.key or w.version != version:
        snapshot = actor.call("pull")
        if snapshot.version != version:
            raise RuntimeError(f"generation {version} is gone: the actor is at version "
                               f"{snapshot.version}")
        w.load(snapshot, source=actor.key)
    return w.evaluate(indices, seeds)


def es_update_task(run: str, actor: Any, version: int, indices, weights, moments,
                   seq: int | None = None) -> ESStep:
    """The ES update, computed beside the parameters from the local noise table; ``seq`` (the
    generation) makes it exactly-once, as a learner's push."""
    from dask_rl.algos import es

    state = run_state(run)
    snapshot = actor.call("pull")
    g = es.weighted_noise(weights, indices, state.noise, len(snapshot.params))
    direction = es.descent_direction(g, snapshot.params, state.cfg.algo.l2)
    ack: PushAck = actor.call("push", direction, version, "es", moments=moments, seq=seq,
                              epoch=actor.epoch, run=run)
    return ESStep(ack=ack, grad_norm=float(np.linalg.norm(g)))


def es_noiseless_task(run: str, actor: Any, episodes: int, seed: int) -> Evaluation:
    """The ES "greedy" evaluation: the mean parameters without noise."""
    w = run_state(run).es_evaluator()
    snapshot = actor.call("pull")
    w.load(snapshot, source=actor.key)
    return w.noiseless(episodes, seed)


def copy_parameters_task(source: Any, destination: Any) -> int:
    """PBT's exploit: one trainer's actor takes over another's state, worker to worker."""
    return destination.call("adopt", source.call("state_dict"))
