"""What every driver shares: the run directory, metrics, checkpoints, progress, evaluations.

:class:`Run` is the base of all drivers — the asynchronous learners' and ES's (through
:class:`~dask_rl.runtime.trainer.Trainer`, which adds the parameter actor) and population-based
training's. It opens the run directory (``metrics.jsonl``, whose records also go to the
scheduler as Dask events for the ``/rl`` page, and the checkpoint store), keeps the counters
every summary reports, records greedy evaluations (stopping a run that reached its target),
runs the final evaluation, and reports progress.

A greedy evaluation that reaches the target is a screening, not a verdict: a run is called
solved only when a *confirming* evaluation of the policy it keeps — ``stop.confirm_episodes``
episodes (the env's standard: 100 for the classic-control tasks, as Gym defines solving them)
on seeds no screening uses — also reaches it, by ``stop.confirm_margin`` standard errors
(:func:`~dask_rl.control.schedule.target_confirmed`). Each stop on a target is a test repeated many
times over a run, and a short evaluation passes by luck often enough to matter (three of
three short-evaluation "solves" of the main job were 334, 442 and 500 over 100 episodes).

Notes
-----
Subclasses implement :meth:`Run.run`, which returns a
:class:`~dask_rl.data.summary.RunSummary`.
"""

from __future__ import annotations

import abc
import collections
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Callable

import numpy as np
from distributed import Client

from dask_rl.checkpoint import CheckpointStore, StoreLocation
from dask_rl.config import ConfigError, PipelineConfig
from dask_rl.control.schedule import RECENT_EPISODES, target_confirmed
from dask_rl.data import Evaluation, Progress
from dask_rl.data.metrics import TOPIC, MetricsLog
from dask_rl.data.summary import RunSummary
from dask_rl.envs import reward_threshold, solved_episodes
from dask_rl.runtime.plugins import register_torch_sizeof
from dask_rl.tracking import Trackers

logger = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run cannot go on (a crash loop, the scheduler gone). ``summary`` is what it got
    to — ``summary.json`` is still written — and the message is the one line the user sees."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


class Run(abc.ABC):
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
        Called with a :class:`~dask_rl.data.Progress` as training advances (the CLI's bar).
    resume
        Continue from the latest checkpoint in the run directory.
    name
        The run's name on the cluster (task keys, worker plugins, events).
    """

    def __init__(self, client: Client, cfg: PipelineConfig, run_dir: str | os.PathLike, *,
                 progress: Callable[[Progress], None] | None = None, resume: bool = False,
                 name: str | None = None):
        self.client = client
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.resume = resume
        self.run_name = name or f"dask-rl-{uuid.uuid4().hex[:8]}"
        self.target = (cfg.stop.target_return if cfg.stop.target_return is not None
                       else reward_threshold(cfg.env))
        self.confirm_episodes = (cfg.stop.confirm_episodes if cfg.stop.confirm_episodes
                                 is not None else solved_episodes(cfg.env))
        self.dashboard: str | None = None
        # counters, checkpointed
        self.env_steps = 0
        self.updates = 0
        self.evals = 0
        self.wall_offset = 0.0  # the wall seconds and env steps of the sessions before a resume
        self.env_steps_offset = 0
        self.best_return: float | None = None
        self.recoveries = 0
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        # live state
        self.last_eval: Evaluation | None = None
        self.target_hit = False            # a screening reached the target: confirm it
        self.confirmation: Evaluation | None = None   # the confirming evaluation, if any
        self.stop_reason: str | None = None
        self.t0 = time.monotonic()
        self.screenings: list[float] = []   # screening returns in order (sweeps prune on them)
        self.trackers: Trackers | None = None   # TensorBoard / MLflow, if the pipeline asks
        self.ended = False                       # the end record was written

    @abc.abstractmethod
    def run(self) -> RunSummary:
        """Train until a stop condition holds; the summary (``summary.json``)."""

    def open_run(self) -> None:
        """Create the run directory, its metrics log and its checkpoint store (the run's own:
        :class:`~dask_rl.checkpoint.StoreLocation`; a resumed run finds it through
        ``RUN_DIR/store.json``)."""
        self.t0 = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        register_torch_sizeof()
        if self.cfg.logging.tensorboard or self.cfg.logging.mlflow is not None:
            try:
                self.trackers = Trackers(self.cfg, self.run_dir, resume=self.resume)
            except Exception as e:  # a wrong tracking URI: said now, not after hours of training
                raise ConfigError(f"logging: cannot open the trackers: "
                                  f"{' '.join(str(e).split())[:300]}") from None
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", sink=self._publish,
                                  run=self.run_name)
        path = self.cfg.checkpoint.path
        where = StoreLocation.find(self.run_dir, checkpoint_path=path) if self.resume else None
        if where is None:
            where = StoreLocation.create(self.run_dir, checkpoint_path=path)
        elif path is not None and where.run_id is not None \
                and not where.path.startswith(path if "://" in path else os.path.abspath(path)):
            logger.warning("checkpoint.path is %s, but this run's checkpoints are in %s: "
                           "resuming there", path, where.path)
        self.store_location = where
        self.store = CheckpointStore(where.path, keep=self.cfg.checkpoint.keep)

    def _publish(self, record: dict) -> None:
        if self.trackers is not None:
            self.trackers.write(record)
        self.client.log_event(TOPIC, record)

    def fail(self, reason: str, stop_reason: str) -> RunFailed:
        """A :class:`RunFailed` carrying this run's counters and its latest checkpoint."""
        try:
            latest = self.store.latest() if hasattr(self, "store") else None
        except Exception:  # a damaged pointer: --resume falls back by itself
            latest = None
        summary = {"algorithm": self.cfg.algo.name, "env_id": self.cfg.env.name,
                   "env_steps": self.env_steps, "updates": self.updates,
                   "wall_s": self.elapsed(), "best_return": self.best_return,
                   "stop_reason": stop_reason, "error": reason,
                   "recoveries": self.recoveries, "latest_checkpoint": latest,
                   "run": self.run_name}
        for key in ("env_steps_discarded", "updates_discarded", "replay_lost"):
            if hasattr(self, key):
                summary[key] = getattr(self, key)
        if hasattr(self, "metrics"):
            self.metrics.write("run", {"event": "failed", **summary})
        resume = f"; the latest checkpoint ({latest}) is intact: --resume continues" \
            if latest else ""
        return RunFailed(f"{reason}{resume}", summary)

    def check_scheduler(self) -> None:
        """Raise :class:`RunFailed` if the client lost its scheduler (nothing can go on)."""
        if self.client.status not in ("running", "newly-created"):
            raise self.fail(f"lost the scheduler ({self.client.status})", "scheduler_lost")

    # ---- counters ------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0 + self.wall_offset

    def steps_per_s(self, env_steps: int | None = None) -> float:
        """Env steps per second of this session (a resumed run counts from its resume)."""
        steps = self.env_steps if env_steps is None else env_steps
        return (steps - self.env_steps_offset) / max(self.elapsed() - self.wall_offset, 1e-9)

    def recent_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    def budget_reason(self) -> str | None:
        """``env_steps`` or ``wall_s`` once that budget is spent."""
        stop = self.cfg.stop
        if self.env_steps >= stop.env_steps:
            return "env_steps"
        if stop.wall_s is not None and self.elapsed() >= stop.wall_s:
            return "wall_s"
        return None

    # ---- evaluations and progress --------------------------------------------------------------
    def record_eval(self, result: Evaluation) -> None:
        """A screening (greedy) evaluation came back: log it; reaching the target asks for a
        confirmation (:attr:`target_hit`), which the driver runs when its policy is still."""
        self._log_eval(result, "screening")
        if (self.cfg.stop.solve_on_target and self.target is not None
                and result.mean_return >= self.target and self.stop_reason is None):
            self.target_hit = True

    def record_confirmation(self, result: Evaluation) -> bool:
        """A confirming evaluation came back: the run is solved (and stops) if it reached the
        target; otherwise training goes on. Returns whether it was confirmed."""
        self.target_hit = False
        self.confirmation = result
        self._log_eval(result, "confirmation")
        confirmed = self._clears_target(result)
        if confirmed and self.stop_reason is None:
            self.stop_reason = "solved"
        elif not confirmed:
            logger.info("the target was not confirmed: %.1f +- %.1f over %d episodes",
                        result.mean_return, result.std_return, result.episodes)
        return confirmed

    def _clears_target(self, result: Evaluation) -> bool:
        return self.target is not None and target_confirmed(
            mean=result.mean_return, std=result.std_return, episodes=result.episodes,
            target=self.target, margin=self.cfg.stop.confirm_margin)

    def confirm_seed(self) -> int:
        """Seeds of confirming evaluations: a range no screening or rollout uses."""
        return 1_000_000_000 + 1_000 * self.evals

    def _log_eval(self, result: Evaluation, purpose: str) -> None:
        self.last_eval = result
        if purpose == "screening":
            self.screenings.append(result.mean_return)
        ret = result.mean_return
        self.best_return = ret if self.best_return is None else max(self.best_return, ret)
        self.metrics.write("eval", {"env_steps": self.env_steps, "updates": self.updates,
                                    "wall_s": self.elapsed(), "purpose": purpose,
                                    **result.record()})
        logger.info("greedy %s at %d steps (version %d): %.1f over %d episodes", purpose,
                    self.env_steps, result.version, ret, result.episodes)

    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop soon (Ctrl-C, or a sweep pruning the run with ``reason="pruned"``): no new
        work, a final checkpoint and summary, no final evaluation when one exists already.
        Safe to call from a signal handler and from another thread."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def final_evaluation(self, evaluate: Callable[[int, int], Evaluation]) -> Evaluation:
        """The evaluation the summary reports, of the final policy: the confirmation that
        solved the run (or, for an interrupted run, the last evaluation), or a new screening
        — followed by a confirmation when it reaches the target, so that ``solved`` is always
        judged on ``confirm_episodes`` fresh episodes. ``evaluate(episodes, seed)``."""
        if self.stop_reason == "solved" and self.confirmation is not None:
            return self.confirmation
        self.confirmation = None  # one of an earlier policy says nothing of the final one
        if self.stop_reason in ("interrupted", "pruned") and self.last_eval is not None:
            return self.last_eval
        result = evaluate(self.cfg.stop.eval_episodes, 10_000 + self.evals + 1)
        self._log_eval(result, "screening")
        if self.target is not None and result.mean_return >= self.target:
            result = evaluate(self.confirm_episodes, self.confirm_seed())
            self.record_confirmation(result)
        return result

    def solved(self) -> bool:
        """Whether a confirming evaluation of the final policy reached the target."""
        return self.confirmation is not None and self._clears_target(self.confirmation)

    def report_progress(self, *, env_steps: int | None = None, total: int | None = None,
                        recent_return: float | None = None, updates: int | None = None,
                        steps_per_s: float | None = None,
                        eval_return: float | None = None) -> None:
        """Tell the progress callback where the run stands (defaults: this run's counters)."""
        if self.progress is None:
            return
        last = self.last_eval.mean_return if self.last_eval is not None else None
        self.progress(Progress(
            env_steps=self.env_steps if env_steps is None else env_steps,
            total=self.cfg.stop.env_steps if total is None else total,
            recent_return=self.recent_return() if recent_return is None else recent_return,
            updates=self.updates if updates is None else updates,
            steps_per_s=self.steps_per_s() if steps_per_s is None else steps_per_s,
            eval_return=last if eval_return is None else eval_return,
            dashboard=self.dashboard, screenings=tuple(self.screenings)))

    def end(self, summary: RunSummary, *, omit: tuple[str, ...] = ()) -> RunSummary:
        """Write the run's end record (the summary, less the ``omit`` keys); returns it."""
        record = {k: v for k, v in summary.to_dict().items() if k not in omit}
        self.metrics.write("run", {"event": "end", **record})
        self.ended = True
        return summary

    def close(self) -> None:
        if self.trackers is not None:
            self._finish_tracking()
        if hasattr(self, "metrics"):
            self.metrics.close()

    def _finish_tracking(self) -> None:
        """Close the trackers; MLflow gets the exported policy of the newest checkpoint."""
        assert self.trackers is not None
        artifacts = []
        if self.cfg.logging.mlflow is not None and hasattr(self, "store"):
            try:
                from dask_rl.policy import export, policy_from_store

                path = export(policy_from_store(self.store, cfg=self.cfg),
                              self.run_dir / "policy.pt")
                artifacts = [(path, "policy"), (Path(f"{path}.json"), "policy")]
            except Exception as e:  # no checkpoint yet, or the export failed: say so, go on
                logger.warning("no policy for MLflow: %s", e)
        self.trackers.finish(status="FINISHED" if self.ended else "FAILED",
                             artifacts=artifacts)
        self.trackers = None
