"""What every trainer shares: run directory, metrics, checkpoints, the parameter actor.

:class:`Trainer` is the base of the asynchronous driver (PPO, IMPACT) and of the ES driver. It
opens the run (``metrics.jsonl``, the checkpoint store, the run's worker plugin, the supervised
parameter actor), resumes from or recovers to the latest checkpoint, records greedy
evaluations, and assembles the summary. Subclasses implement the loop.

Notes
-----
Subclasses override hooks that do nothing by default: :meth:`initial_params`,
:meth:`driver_state` / :meth:`load_driver_state` (their counters in checkpoints),
:meth:`write_extra` / :meth:`restore_extra` (bulk state written by workers) and
:meth:`summary_extra`.
"""

from __future__ import annotations

import abc
import collections
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
from distributed import Client

from dask_rl.checkpoint import CheckpointStore, Pending
from dask_rl.config import PipelineConfig, to_dict
from dask_rl.envs import reward_threshold
from dask_rl.metrics import MetricsLog
from dask_rl.runtime.cluster import rl_page
from dask_rl.runtime.handle import ActorHandle
from dask_rl.runtime.housekeeping import Housekeeper
from dask_rl.runtime.plugins import RunState, register_torch_sizeof
from dask_rl.runtime.supervisor import ActorSupervisor

logger = logging.getLogger(__name__)

RECENT_EPISODES = 20


class Trainer(abc.ABC):
    """Base of the drivers; :meth:`run` returns the summary.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    cfg
        The validated pipeline.
    run_dir
        Where ``summary.json``, ``metrics.jsonl`` and ``checkpoints/`` go.
    progress
        Called with a small dict as training advances (the CLI's progress bar).
    resume
        Continue from the latest checkpoint in the run directory.
    """

    def __init__(self, client: Client, cfg: PipelineConfig, run_dir: str | os.PathLike, *,
                 progress: Callable[[dict], None] | None = None, resume: bool = False,
                 name: str | None = None):
        self.client = client
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.resume = resume
        self.run_name = name or f"dask-rl-{uuid.uuid4().hex[:8]}"
        self.target = (cfg.stop.target_return if cfg.stop.target_return is not None
                       else reward_threshold(cfg.env.id))
        # counters, checkpointed
        self.env_steps = 0
        self.updates = 0
        self.evals = 0
        self.wall_offset = 0.0
        self.best_return: float | None = None
        self.recoveries = 0
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        # live state
        self.last_eval: dict | None = None
        self.stop_reason: str | None = None
        self.last_checkpoint = 0.0
        self.t0 = time.time()

    # ---- hooks ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        """The actor's initial flat parameters and running statistics."""

    @abc.abstractmethod
    def run(self) -> dict:
        """Train until a stop condition holds; the summary."""

    def actor_options(self) -> dict[str, Any]:
        """How the actor applies gradients (``optimizer``, ``aggregation``)."""
        return {}

    def driver_state(self) -> dict[str, Any]:
        return {}

    def load_driver_state(self, state: dict[str, Any]) -> None:
        pass

    def write_extra(self, pending: Pending) -> tuple[int, dict]:
        """Bulk state written by workers into a pending checkpoint: (count, meta)."""
        return 0, {}

    def restore_extra(self, name: str, meta: dict[str, Any]) -> None:
        pass

    def summary_extra(self, actor_metrics: dict[str, Any]) -> dict[str, Any]:
        return {}

    # ---- opening -------------------------------------------------------------------------------
    def open(self) -> None:
        cfg = self.cfg
        self.t0 = time.time()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        register_torch_sizeof()
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", client=self.client,
                                  run=self.run_name)
        self.store = CheckpointStore(cfg.checkpoint.path or self.run_dir / "checkpoints",
                                     keep=cfg.checkpoint.keep)
        params, moments = self.initial_params()
        self.num_params = len(params)
        self.client.register_plugin(RunState(self.run_name, cfg), name=self.run_name)
        self.dashboard = rl_page(self.client)
        self.housekeeper = Housekeeper(self.client)
        if self.dashboard:
            logger.info("dashboard: %s", self.dashboard)
        self.supervisor = ActorSupervisor(self.client, cfg, self.run_name, params,
                                          moments=moments, **self.actor_options())
        if self.resume:
            self._restore()
        else:
            self.checkpoint()  # recovery always has a checkpoint to return to
        self.last_checkpoint = time.time()

    @property
    def actor(self) -> ActorHandle:
        return self.supervisor.handle

    def elapsed(self) -> float:
        return time.time() - self.t0 + self.wall_offset

    def recent_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    # ---- checkpoints ---------------------------------------------------------------------------
    def maybe_checkpoint(self) -> None:
        every = self.cfg.checkpoint.every_s
        if every > 0 and time.time() - self.last_checkpoint >= every:
            self.checkpoint()

    def checkpoint(self) -> str:
        """Write the actor's and the driver's state as one checkpoint now."""
        t0 = time.perf_counter()
        pending = self.store.begin()
        count, extra_meta = self.write_extra(pending)
        actor_state = self.actor_call("state_dict")
        driver = {"env_steps": self.env_steps, "evals": self.evals, "wall_s": self.elapsed(),
                  "best_return": self.best_return, "recoveries": self.recoveries,
                  "episodes": self.episodes, "recent_returns": list(self.returns),
                  **self.driver_state()}
        meta = {"algorithm": self.cfg.algo.name, "env_id": self.cfg.env.id,
                "config": to_dict(self.cfg), "env_steps": self.env_steps,
                "updates": actor_state["version"], "time": time.time(), **extra_meta}
        name = self.store.commit(pending, {"actor": actor_state, "driver": driver}, meta=meta,
                                 replay=count)
        self.last_checkpoint = time.time()
        self.metrics.write("checkpoint", {"name": name, "seconds": time.perf_counter() - t0,
                                          "env_steps": self.env_steps,
                                          "updates": actor_state["version"]})
        return name

    def load_checkpoint(self) -> tuple[dict, dict, str]:
        """The newest good checkpoint of this run, loaded into the parameter actor."""
        state, meta, name = self.store.load_latest_good(
            expect={"algorithm": self.cfg.algo.name, "env_id": self.cfg.env.id,
                    "num_params": self.num_params})
        self.actor.call("load_state_dict", state["actor"])
        self.updates = int(state["actor"]["version"])
        self.restore_extra(name, meta)
        return state, meta, name

    def _restore(self) -> None:
        state, _, name = self.load_checkpoint()
        d = state["driver"]
        self.env_steps = int(d["env_steps"])
        self.evals = int(d["evals"])
        self.wall_offset = float(d["wall_s"])
        self.best_return = d.get("best_return")
        self.recoveries = int(d.get("recoveries", 0))
        self.episodes = int(d.get("episodes", 0))
        self.returns.extend(d.get("recent_returns", []))
        self.load_driver_state(d)
        logger.info("resumed from %s at %d env steps, version %d", name, self.env_steps,
                    self.updates)
        self.metrics.write("resume", {"checkpoint": name, "env_steps": self.env_steps,
                                      "updates": self.updates})

    def actor_call(self, method: str, *args, **kwargs):
        """Call the parameter actor from the driver; a lost actor is re-created first."""
        try:
            return self.actor.call(method, *args, **kwargs)
        except (OSError, TimeoutError) as e:
            if self.supervisor.alive(timeout=min(5.0, self.cfg.checkpoint.actor_timeout_s)):
                raise
            self.on_actor_lost(f"the parameter actor is gone ({e!r})")
            return self.actor.call(method, *args, **kwargs)

    def on_actor_lost(self, reason: str) -> None:
        """Recover from a lost actor; drivers with work in flight also drop that work."""
        self.replace_actor(reason)

    def replace_actor(self, reason: str) -> str:
        """Re-create a lost or hung parameter actor from the latest checkpoint."""
        self.recoveries += 1
        logger.warning("recovery %d: %s", self.recoveries, reason)
        before = self.updates
        self.supervisor.replace()
        _, _, name = self.load_checkpoint()
        self.metrics.write("recovery", {"reason": reason, "checkpoint": name,
                                        "version_lost": before, "version": self.updates,
                                        "env_steps": self.env_steps,
                                        "recoveries": self.recoveries,
                                        "actor_worker": self.supervisor.address})
        return name

    # ---- stopping, evaluating, summarising -----------------------------------------------------
    def budget_reason(self) -> str | None:
        """``env_steps`` or ``wall_s`` once that budget is spent."""
        stop = self.cfg.stop
        if self.env_steps >= stop.env_steps:
            return "env_steps"
        if stop.wall_s is not None and self.elapsed() >= stop.wall_s:
            return "wall_s"
        return None

    def record_eval(self, result: dict) -> None:
        """A greedy evaluation came back: log it; stop if it reached the target."""
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

    def summary(self, final: dict) -> dict:
        actor_metrics = self.actor_call("metrics")
        self.checkpoint()
        wall = self.elapsed()
        summary = {
            "algorithm": self.cfg.algo.name, "env_id": self.cfg.env.id,
            "env_steps": self.env_steps, "updates": actor_metrics["version"], "wall_s": wall,
            "steps_per_s": self.env_steps / max(wall - self.wall_offset, 1e-9),
            "final_return": final["mean_return"], "final_return_std": final["std_return"],
            "best_return": self.best_return, "target_return": self.target,
            "solved": self.target is not None and final["mean_return"] >= self.target,
            "stop_reason": self.stop_reason,
            "staleness_mean": actor_metrics["staleness/mean"],
            "staleness_max": actor_metrics["staleness/max"],
            "staleness_histogram": actor_metrics["staleness/histogram"],
            "gradients_applied": actor_metrics["gradients/applied"],
            "gradients_dropped": actor_metrics["gradients/dropped"],
            "gradients_rejected": actor_metrics["gradients/rejected"],
            "recoveries": self.recoveries, "episodes": self.episodes,
            "actor_apply_share": actor_metrics["actor/apply_s"] / max(wall, 1e-9),
            "worker_threads": sum(self.client.nthreads().values()), "run": self.run_name,
            **self.summary_extra(actor_metrics),
        }
        self.metrics.write("run", {"event": "end", **summary})
        return summary

    def close(self, inflight: list | None = None) -> None:
        try:
            if inflight:
                self.client.cancel(inflight)
            self.client.unregister_worker_plugin(self.run_name)
        except Exception:
            logger.debug("closing the run", exc_info=True)
        if hasattr(self, "metrics"):
            self.metrics.close()
