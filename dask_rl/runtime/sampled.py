"""TianJi's replay path on Dask: a worker-resident buffer that value-based learners sample.

The driver's part of it (:class:`~dask_rl.runtime.driver.Driver` delegates here when the
algorithm is a :class:`~dask_rl.algos.replay.ReplayAlgorithm`, e.g. DQN):

* a finished rollout's trajectory joins the :class:`~dask_rl.control.replay.TransitionReplay`
  — its *future*: the data stays on the worker that collected it — and a small task counts its
  env steps and episodes where it lies;
* a learner is a batch plan: ``updates_per_task x B_s`` transitions drawn uniformly from the
  buffer, cut by one ``sample_task`` per worker holding sampled trajectories, on that worker
  (only the sampled rows move), then one ``replay_learner_task`` that takes a gradient step
  per ``B_s`` rows and pushes its delta to the parameter actor, exactly once;
* before each learner, :class:`~dask_rl.control.replay.SampleStaleness` measures
  ``P = B_s / N_s``, grows the buffer (or, at its cap, shrinks the batch) when ``P`` is above
  the tolerance, and sets the learner's rate to ``alpha / (1 + lambda P)`` — ``alpha`` is
  ``learner.lr``, annealed linearly to 0 over the budget when ``learner.anneal_lr`` (the
  default; DQN's papers keep it constant, so ``dqn_cartpole.yaml`` sets it false); each
  decision is a ``replay`` record in ``metrics.jsonl``.

The launch policy runs ``max_learners`` sampled learners whenever the buffer holds
``learning_starts`` transitions; rollouts wait only while the learners are behind the
``replay_ratio`` (transitions learned per env step), which on a small cluster is TianJi's
throughput balance: collecting faster than the learners can learn would only age the buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from distributed import Client, Future

from dask_rl.algos.replay import ReplayConfig
from dask_rl.config.schema import PipelineConfig
from dask_rl.control.replay import SampleStaleness, TransitionReplay
from dask_rl.runtime.tasks import replay_learner_task, sample_task, trajectory_stats_task


class SampledReplay:
    """The buffer, its controller and the submission of sampled learners, for one run."""

    def __init__(self, cfg: PipelineConfig, client: Client, run_name: str):
        algo = cfg.algo
        if not isinstance(algo, ReplayConfig):
            raise TypeError(f"algorithm {algo.name!r} does not learn from a replay buffer")
        self.cfg, self.algo, self.client, self.run_name = cfg, algo, client, run_name
        self.buffer: TransitionReplay[Future] = TransitionReplay(capacity=algo.buffer_size)
        self.control = SampleStaleness(
            batch=algo.batch_size, capacity=algo.buffer_size,
            tolerance=algo.staleness_tolerance, max_capacity=algo.max_buffer_size,
            min_batch=algo.min_batch_size, chunk=cfg.batch_size, lam=algo.staleness_lambda)
        self.rng = np.random.default_rng([cfg.seed, 7])
        self.learned = 0   # transitions learned from (gradient steps x batch), for the ratio

    def behind(self, collected: int) -> bool:
        """Whether the learners are more than one task per learner behind the replay ratio
        (then rollouts wait: collecting faster than the learners learn only ages the
        buffer)."""
        owed = (collected - self.algo.learning_starts) * self.algo.replay_ratio - self.learned
        slack = self.cfg.learner.max_learners * self.control.batch * self.algo.updates_per_task
        return self.ready and owed > slack

    def learner_done(self, samples: int) -> None:
        self.learned += samples

    @property
    def ready(self) -> bool:
        """Enough transitions for learners to start."""
        return self.buffer.size >= self.algo.learning_starts

    def stored(self, trajectory: Future) -> Future:
        """A rollout finished: keep its trajectory; returns the future of its counts."""
        self.buffer.add(trajectory, steps=self.cfg.rollout.steps, envs=self.cfg.env.num_envs)
        return self.client.submit(trajectory_stats_task, trajectory, pure=False)

    def submit_learner(self, actor: Any, learner_id: str, lr: float, seed: int, seq: int,
                       **placement: Any) -> tuple[Future, dict]:
        """Control P, draw a batch plan, cut it where the data lies, launch the learner;
        returns its future and the ``replay`` record of the decision."""
        held = self.buffer.size
        action = self.control.control(held)
        self.buffer.capacity = self.control.capacity
        ratio = self.control.ratio(held)
        rate = self.control.learning_rate(lr, held)
        batch = self.control.batch
        plan = self.buffer.sample(batch * self.algo.updates_per_task, self.rng)
        # one sample task per worker, run where its trajectories lie
        holders = self.client.who_has(list(plan))
        by_worker: dict[str | None, list[Future]] = {}
        for trajectory in plan:
            where = holders.get(trajectory.key) or [None]
            by_worker.setdefault(where[0], []).append(trajectory)
        samples = [self.client.submit(sample_task, self.run_name, trajs,
                                      [plan[x] for x in trajs], pure=False,
                                      **({"workers": [w], "allow_other_workers": True}
                                         if w else {}))
                   for w, trajs in by_worker.items()]
        fut = self.client.submit(replay_learner_task, self.run_name, samples, actor, learner_id,
                                 rate, batch, seed, seq, pure=False,
                                 key=f"learner-{learner_id}-{self.run_name}", **placement)
        record = {"staleness_ratio": ratio, "batch": batch, "capacity": self.control.capacity,
                  "held": held, "action": action, "lr_base": lr, "lr": rate,
                  "tianji_rule": self.control.rule(held),
                  "trajectories_sampled": len(plan)}
        return fut, record

    # ---- checkpoints and recovery ----------------------------------------------------------
    def state(self) -> dict:
        return {"replay_batch": self.control.batch, "replay_capacity": self.control.capacity,
                "replay_learned": self.learned}

    def load_state(self, d: dict) -> None:
        self.control.batch = int(d.get("replay_batch", self.control.batch))
        self.control.capacity = int(d.get("replay_capacity", self.control.capacity))
        self.buffer.capacity = self.control.capacity
        self.learned = int(d.get("replay_learned", 0))

    def lost(self) -> int:
        """A recovery throws the buffer away; returns how many trajectories it held."""
        n = len(self.buffer)
        self.buffer.clear()
        return n
