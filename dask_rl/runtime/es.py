"""The evolution-strategies driver: generations of perturbation tasks on a Dask cluster.

Each generation (Salimans et al. 2017, as Fiber runs it): the driver draws ``pairs`` noise-table
offsets and seeds, splits them into tasks of ``pairs_per_task`` antithetic pairs — each task
plays whole episodes for ``theta +- sigma * eps`` on a worker that holds the shared noise table
and the generation's ``theta`` (cached per worker by version) and returns scalars only — then
ranks the ``2N`` returns and sends the per-pair weights to a task on the parameter actor's
worker, which forms the weighted noise sum from its own table and pushes the step to the actor
(Adam, ``algo.lr``). Every ``algo.eval_every`` generations a noiseless evaluation of ``theta``
runs beside the perturbations; reaching ``stop.target_return`` ends the run.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from dask_rl.algos import es
from dask_rl.config import AsyncConfig, to_dict
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat, make_policy
from dask_rl.models.normalizer import empty_moments, merge_moments
from dask_rl.runtime.tasks import es_evaluate_task, es_noiseless_task, es_update_task
from dask_rl.runtime.trainer import Trainer

logger = logging.getLogger(__name__)


class ESDriver(Trainer):
    """OpenAI-ES on a Dask cluster; :meth:`run` returns the summary."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generation = 0
        self.rng = np.random.default_rng(self.cfg.seed)

    # ---- hooks ---------------------------------------------------------------------------------
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        cfg = self.cfg
        obs_space, action_space = env_spaces(cfg.env)
        policy = make_policy(obs_space, action_space, cfg.model,
                             normalize_obs=cfg.env.normalize_obs, seed=cfg.seed)
        params = get_flat(policy)
        if len(params) > cfg.algo.noise_table_size:
            from dask_rl.config import ConfigError

            raise ConfigError(f"algo.noise_table_size: must be >= the policy's {len(params)} "
                              f"parameters, got {cfg.algo.noise_table_size}")
        moments = ({"obs": empty_moments(int(np.prod(obs_space.shape)))}
                   if cfg.env.normalize_obs else None)
        return params, moments

    def actor_options(self) -> dict:
        return {"optimizer": "adam", "aggregation": AsyncConfig(lr=self.cfg.algo.lr)}

    def driver_state(self) -> dict:
        return {"generation": self.generation, "rng": self.rng.bit_generator.state}

    def load_driver_state(self, d: dict) -> None:
        self.generation = int(d["generation"])
        self.rng.bit_generator.state = d["rng"]

    def summary_extra(self, actor_metrics: dict) -> dict:
        return {"generations": self.generation, "population": 2 * self.cfg.algo.pairs,
                "pairs_per_task": self.cfg.algo.pairs_per_task}

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> dict:
        try:
            self.open()
            self.metrics.write("run", {"event": "start", "config": to_dict(self.cfg),
                                       "num_params": self.num_params})
            while self.stop_reason is None:
                reason = self.budget_reason()
                if reason is not None:
                    self.stop_reason = reason
                    break
                self._generation()
                if self.supervisor.heartbeat_due() and not self.supervisor.alive():
                    self.replace_actor("the parameter actor missed its heartbeat")
                self.maybe_checkpoint()
                self.housekeeper.maybe_tidy()
            final = self.last_eval
            if self.stop_reason != "solved" or final is None:
                final = self._noiseless().result()
                self.record_eval(final)
            return self.summary(final)
        finally:
            self.close()

    def _noiseless(self):
        self.evals += 1
        return self.client.submit(es_noiseless_task, self.run_name, self.actor,
                                  self.cfg.stop.eval_episodes, 10_000 * self.evals, pure=False,
                                  key=f"es-noiseless-{self.evals}-{self.run_name}")

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
        evaluation = self._noiseless() if self.generation % cfg.eval_every == 0 else None
        try:
            results = self.client.gather(tasks)
        except Exception as e:  # a lost actor takes the generation with it
            if not self.supervisor.alive(timeout=5.0):
                self.client.cancel(tasks + ([evaluation] if evaluation else []))
                self.replace_actor(f"an ES task failed and the parameter actor is gone: {e!r}")
                return
            raise
        returns = np.concatenate([r["returns"] for r in results])
        lengths = np.concatenate([r["lengths"] for r in results])
        moments = None
        for r in results:
            if r["moments"] is not None:
                moments = r["moments"] if moments is None else merge_moments(moments,
                                                                              r["moments"])
        weights = es.weights(returns)
        update = self.client.submit(
            es_update_task, self.run_name, self.actor, version, idx, weights,
            {"obs": moments} if moments is not None else None, pure=False,
            workers=[self.supervisor.address], allow_other_workers=True,
            key=f"es-update-{self.generation}-{self.run_name}")
        ack = update.result()
        self.updates = ack["version"]
        self.generation += 1
        self.env_steps += int(lengths.sum())
        self.episodes += returns.size * cfg.episodes
        self.returns.extend(returns.ravel().tolist())
        if evaluation is not None:  # noiseless episodes are not counted as training steps
            self.record_eval(evaluation.result())
        seconds = time.perf_counter() - t0
        record = {"generation": self.generation, "env_steps": self.env_steps,
                  "updates": self.updates, "wall_s": self.elapsed(),
                  "charts/return_mean": float(returns.mean()),
                  "charts/return_max": float(returns.max()),
                  "charts/return_min": float(returns.min()),
                  "charts/return_recent": self.recent_return(),
                  "charts/episodic_length": float(lengths.mean() / cfg.episodes),
                  "es/grad_norm": ack["grad_norm"], "es/status": ack["status"],
                  "es/tasks": len(tasks), "es/generation_s": seconds,
                  "steps_per_s": self.env_steps / max(self.elapsed() - self.wall_offset, 1e-9)}
        self.metrics.write("generation", record)
        if self.progress is not None:
            self.progress({"env_steps": self.env_steps, "total": self.cfg.stop.env_steps,
                           "return": float(returns.mean()), "updates": self.updates,
                           "steps_per_s": record["steps_per_s"],
                           "eval": self.last_eval and self.last_eval["mean_return"],
                           "dashboard": self.dashboard})
