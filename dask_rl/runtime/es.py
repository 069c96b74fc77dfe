"""The evolution-strategies driver: generations of perturbation tasks on a Dask cluster.

Each generation (Salimans et al. 2017, as Fiber runs it): the driver draws ``pairs`` noise-table
offsets and seeds, splits them into tasks of ``pairs_per_task`` antithetic pairs — each task
plays whole episodes for ``theta +- sigma * eps`` on a worker that holds the shared noise table
and the generation's ``theta`` (cached per worker by version) and returns scalars only — then
ranks the ``2N`` returns and sends the per-pair weights to a task on the parameter actor's
worker, which forms the weighted noise sum from its own table and pushes the step to the actor
(Adam, ``algo.step_size``). Every ``algo.eval_every`` generations a noiseless evaluation of
``theta`` runs beside the perturbations; reaching ``stop.target_return`` ends the run.

Built from the asynchronous driver's parts where the work is the same: evaluations through
:class:`~dask_rl.runtime.evaluations.EvaluationTasks` (with ES's noiseless task) and its
:class:`~dask_rl.runtime.gate.EvaluationGate`, checkpoints through
:class:`~dask_rl.runtime.checkpoints.Checkpoints`, periodic duties in one
:class:`~dask_rl.runtime.timers.Timers` table. Its generations are its own: synchronous by
the algorithm, each gathered whole.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from dask_rl.algos import es
from dask_rl.config import ConfigError, public_dict
from dask_rl.data import ESStep, Evaluation, PerturbationResult
from dask_rl.data.summary import ESSummary
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat, make_policy
from dask_rl.models.normalizer import empty_moments, merge_moments
from dask_rl.runtime.cluster import attach_dashboard
from dask_rl.runtime.evaluations import EvaluationTasks
from dask_rl.runtime.run import Abandoned, RunFailed
from dask_rl.runtime.tasks import es_evaluate_task, es_noiseless_task, es_update_task
from dask_rl.runtime.timers import Timers
from dask_rl.runtime.trainer import MAX_CONSECUTIVE_FAILURES, Trainer
from dask_rl.staleness.asynchronous import AsyncConfig

logger = logging.getLogger(__name__)


class ESDriver(Trainer):
    """OpenAI-ES on a Dask cluster; :meth:`run` returns an
    :class:`~dask_rl.data.summary.ESSummary`."""

    evaluation_task = staticmethod(es_noiseless_task)   # the mean parameters, no noise

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generation = 0
        self.failures = 0  # failed generations in a row
        self.rng = np.random.default_rng(self.cfg.seed)
        self.evaluations = EvaluationTasks(self)

    def timers(self) -> Timers:
        """The periodic duties, after each generation (period 0: each keeps its own cadence)."""
        return Timers([(0.0, self.check_heartbeat),
                       (0.0, self.checkpoints.maybe),     # on checkpoint.every_s
                       (0.0, self.housekeeper.maybe_tidy)])

    # ---- hooks ---------------------------------------------------------------------------------
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        cfg = self.cfg
        obs_space, action_space = env_spaces(cfg.env)
        policy = make_policy(obs_space, action_space, cfg.model,
                             normalize_obs=cfg.env.normalize_obs, seed=cfg.seed)
        params = get_flat(policy)
        if len(params) > cfg.algo.noise_table_size:
            raise ConfigError(f"algo.noise_table_size: must be >= the policy's {len(params)} "
                              f"parameters, got {cfg.algo.noise_table_size}")
        moments = ({"obs": empty_moments(int(np.prod(obs_space.shape)))}
                   if cfg.env.normalize_obs else None)
        return params, moments

    def actor_options(self) -> dict:
        return {"optimizer": "adam", "aggregation": AsyncConfig(alpha0=self.cfg.algo.step_size)}

    def plugin_options(self) -> dict:
        return {"noise": (self.cfg.algo.noise_seed, self.cfg.algo.noise_table_size)}

    def driver_state(self) -> dict:
        return {"generation": self.generation, "rng": self.rng.bit_generator.state}

    def load_driver_state(self, d: dict) -> None:
        self.generation = int(d["generation"])
        self.rng.bit_generator.state = d["rng"]

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> ESSummary:
        try:
            try:
                self.open()
                self.metrics.write("run", {"event": "start", "config": public_dict(self.cfg),
                                           "num_params": self.num_params})
                attach_dashboard(self.client)   # an embedded cluster's, beside the first tasks
                timers = self.timers()
                while self.stop_reason is None:
                    reason = self.budget_reason()
                    if reason is not None:
                        self.stop_reason = reason
                        break
                    self._generation()
                    timers.run()
                if not self.interrupted:
                    self.checkpoints.write()  # the final policy is safe before the last calls
                    final = self.gate.final(self.evaluations.now)
                    return self.end(self._summary(final, self.trainer_summary(final)))
            except Abandoned as e:  # interrupted while waiting on something that did not end
                logger.info("interrupted: %s", e)
            return self._finish_interrupted()
        except RunFailed:
            raise
        except Exception as e:
            if self.interrupted and hasattr(self, "metrics"):
                # a cluster going with the signal: the end still comes, with its summary
                logger.warning("interrupted: %s", " ".join(
                    f"{type(e).__name__}: {e}".split())[:300])
                return self._finish_interrupted()
            self.check_scheduler()  # a lost scheduler is one line, not this traceback
            raise
        finally:
            self.close()

    def _finish_interrupted(self) -> ESSummary:
        """An interrupted run's end (see the driver's): a final checkpoint only if the actor
        answers in time, no new evaluation, the driver's counters where the actor is silent."""
        written = self.checkpoints.final()
        final = self.gate.final(self.evaluations.now)  # the last one; none is started
        return self.end(self._summary(final, self.trainer_summary(
            final, self.final_actor_metrics())), extra=self.interrupted_extra(written))

    def _summary(self, final: Evaluation | None, fields: dict) -> ESSummary:
        cfg = self.cfg.algo
        return ESSummary(**fields, generations=self.generation, population=2 * cfg.pairs,
                         pairs_per_task=cfg.pairs_per_task)

    def _gather(self, futures: list, also: list = (), timeout: float | None = None
                ) -> list | None:
        """The futures' results, or None when a task failed: all of them and ``also`` are
        cancelled and the generation is redone.

        If the parameter actor is gone it is recovered first. If it lives (a task's actor call
        timed out on a busy machine, a result lost with a worker was recomputed and failed),
        the driver re-reads the actor's version: an update that was applied before its result
        was lost stays applied once (the redone generation's push repeats its sequence number
        and is refused). ``MAX_CONSECUTIVE_FAILURES`` failed generations in a row end the run.
        ``timeout`` bounds the wait (a short task that does not finish in it has failed).
        """
        self.hooks.gather(self)
        try:
            # polled: an interrupt gives it up (Abandoned); its timeout fails it (below)
            self.wait_all(futures, timeout, first_error=True)
            result = self.client.gather(futures)
            self.failures = 0
            return result
        except Exception as e:
            self.client.cancel([*futures, *also])
            if isinstance(e, Abandoned):
                raise
            if self.interrupted:  # no recovery nor redo on a cluster that may be going
                raise Abandoned(f"an ES task failed: {type(e).__name__}") from e
            if not self.supervisor.alive(timeout=min(5.0, self.cfg.checkpoint.actor_timeout_s)):
                self.on_actor_lost(f"an ES task failed and the parameter actor is gone: {e!r}")
                return None
            self.failures += 1
            if self.failures >= MAX_CONSECUTIVE_FAILURES:
                raise RuntimeError(f"{self.failures} ES generations failed in a row; last "
                                   f"error: {e!r}") from e
            logger.warning("an ES task failed (%r); generation %d is redone", e, self.generation)
            self.updates = self.actor_call("ping")
            return None

    def _generation(self) -> None:
        cfg = self.cfg.algo
        t0 = time.perf_counter()
        version = self.updates
        idx = es.ask(self.rng, table_size=cfg.noise_table_size, dim=self.num_params,
                     pairs=cfg.pairs)
        seeds = self.rng.integers(0, 2**31 - 1, size=cfg.pairs)
        tasks = []
        for start in range(0, cfg.pairs, cfg.pairs_per_task):
            sl = slice(start, start + cfg.pairs_per_task)
            tasks.append(self.client.submit(
                es_evaluate_task, self.run_name, self.actor, version, idx[sl], seeds[sl],
                pure=False, key=f"es-eval-{self.generation}-{start}-{self.run_name}"))
        evaluation = (self.evaluations.submit("eval", held=False)
                      if self.generation % cfg.eval_every == 0 else None)
        results: list[PerturbationResult] | None = self._gather(
            tasks, also=[evaluation] if evaluation else [])
        if results is None:
            return
        returns = np.concatenate([r.returns for r in results])
        lengths = np.concatenate([r.lengths for r in results])
        moments = None
        for r in results:
            if r.moments is not None:
                moments = r.moments if moments is None else merge_moments(moments, r.moments)
        weights = es.weights(returns)
        update = self.client.submit(
            es_update_task, self.run_name, self.actor, version, idx, weights,
            {"obs": moments} if moments is not None else None, self.generation, pure=False,
            workers=[self.supervisor.address], allow_other_workers=True,
            key=f"es-update-{self.generation}-{self.run_name}")
        # the update is short (a weighted noise sum and a push): waiting longer than a few actor
        # timeouts for it means it is stuck (a CI run saw one hang after the actor's worker died)
        got = self._gather([update], also=[evaluation] if evaluation else [],
                           timeout=max(3 * self.cfg.checkpoint.actor_timeout_s, 30.0))
        if got is None:  # the actor was lost around the update: the generation is redone
            return
        step: ESStep = got[0]
        self.updates = step.ack.version
        self.generation += 1
        self.env_steps += int(lengths.sum())
        self.episodes += returns.size * cfg.episodes
        self.returns.extend(returns.ravel().tolist())
        if evaluation is not None:  # noiseless episodes are not counted as training steps
            evaluated = self._gather([evaluation])
            if evaluated is not None:
                self.gate.screened(evaluated[0])
        if self.gate.target_hit:  # generations are synchronous: theta is still, confirm it now
            self.gate.confirmed(self.evaluations.now(self.gate.confirm_episodes,
                                                     self.gate.confirm_seed(), kind="confirm"))
        seconds = time.perf_counter() - t0
        record = {"generation": self.generation, "env_steps": self.env_steps,
                  "updates": self.updates, "wall_s": self.elapsed(),
                  "charts/return_mean": float(returns.mean()),
                  "charts/return_max": float(returns.max()),
                  "charts/return_min": float(returns.min()),
                  "charts/return_recent": self.recent_return(),
                  "charts/episodic_length": float(lengths.mean() / cfg.episodes),
                  "es/grad_norm": step.grad_norm, "es/status": step.ack.status,
                  "es/tasks": len(tasks), "es/generation_s": seconds,
                  "steps_per_s": self.steps_per_s()}
        self.metrics.write("generation", record)
        self.report_progress(recent_return=float(returns.mean()))
