"""What every driver shares: the run directory, metrics, checkpoints, progress, evaluations.

:class:`Run` is the base of all drivers — the asynchronous learners' and ES's (through
:class:`~dask_rl.runtime.trainer.Trainer`, which adds the parameter actor) and population-based
training's. It opens the run directory (``metrics.jsonl``, whose records also go to the
scheduler as Dask events for the ``/rl`` page, and the checkpoint store), keeps the counters
every summary reports, holds its evaluation gate (screenings and the confirmation that calls a
run solved: :class:`~dask_rl.runtime.gate.EvaluationGate`), ends within a deadline when
interrupted, and reports progress.

Notes
-----
Subclasses implement :meth:`Run.run`, which returns a
:class:`~dask_rl.data.summary.RunSummary`.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
from distributed import Client, Future, wait

from dask_rl.checkpoint import CheckpointStore, StoreLocation
from dask_rl.config import ConfigError, PipelineConfig
from dask_rl.control.schedule import RECENT_EPISODES
from dask_rl.data import Progress
from dask_rl.data.metrics import TOPIC, MetricsLog
from dask_rl.data.summary import RunSummary
from dask_rl.runtime.events import EventSender
from dask_rl.runtime.gate import EvaluationGate
from dask_rl.runtime.hooks import RunHooks
from dask_rl.runtime.plugins import register_torch_sizeof
from dask_rl.tracking import Trackers, redact

logger = logging.getLogger(__name__)

# An interrupted run ends on one clock started by the signal (SIGINT/SIGTERM to the process
# group reaches the embedded workers too: the actor's may be gone). A wait that was in flight
# when the signal came is given up INTERRUPT_GRACE_S after it; the end's own steps have their
# marks after it (Driver/ES), all before INTERRUPT_DEADLINE_S, which leaves the rest of the
# 30 s a user or an orchestrator waits before killing to close the cluster (a loaded 2-core
# machine took 8 s to close an embedded one).
INTERRUPT_GRACE_S = 5.0
INTERRUPT_DEADLINE_S = 15.0
POLL_S = 0.25   # waits poll this often, so that an interrupt is seen within it
EVENTS_FLUSH_S = 5.0   # how long the end waits for the last records to reach the scheduler


class Abandoned(Exception):
    """Work given up because the run was interrupted and its time to end ran out (its
    workers may be going: waiting longer could wait forever)."""


class RunFailed(RuntimeError):
    """The run cannot go on (a crash loop, the scheduler gone). ``summary`` is what it got
    to — ``summary.json`` is still written — and the message is the one line the user sees."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


def _with_extra(summary: RunSummary, extra: dict[str, Any]) -> RunSummary:
    """``summary`` as an instance of a subclass of its type with the ``extra`` fields too."""
    cls = dataclasses.make_dataclass(
        type(summary).__name__, [(k, Any, dataclasses.field(default=None)) for k in extra],
        bases=(type(summary),))
    fields = {f.name: getattr(summary, f.name) for f in dataclasses.fields(summary)}
    return cls(**fields, **extra)


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
                 name: str | None = None, hooks: RunHooks | None = None):
        self.client = client
        self.events = EventSender(client)   # records to the scheduler, never waited for
        self.cfg = cfg
        self.hooks = hooks or RunHooks()
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.resume = resume
        self.run_name = name or f"dask-rl-{uuid.uuid4().hex[:8]}"
        self.dashboard: str | None = None
        # counters, checkpointed
        self.env_steps = 0
        self.updates = 0
        self.wall_offset = 0.0  # the wall seconds and env steps of the sessions before a resume
        self.env_steps_offset = 0
        self.recoveries = 0
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        # live state
        self.gate = EvaluationGate(self)   # the evaluations' verdict
        self.stop_reason: str | None = None
        self.t0 = time.monotonic()
        self.trackers: Trackers | None = None   # TensorBoard / MLflow, if the pipeline asks
        self.ended = False                       # the end record was written
        # the interrupt's clock (monotonic), and how long after it a wait may still go on
        self.interrupted_at: float | None = None
        self.abandon_after = INTERRUPT_GRACE_S

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
            except ConfigError:   # already one line, credentials redacted
                raise
            except Exception as e:  # a wrong tracking URI: said now, not after hours of training
                raise ConfigError(f"logging: cannot open the trackers: "
                                  f"{redact(' '.join(str(e).split()))[:300]}") from None
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
        self.events.send(TOPIC, record)

    def fail(self, reason: str, stop_reason: str) -> RunFailed:
        """A :class:`RunFailed` carrying this run's counters and its latest checkpoint."""
        try:
            latest = self.store.latest() if hasattr(self, "store") else None
        except Exception:  # a damaged pointer: --resume falls back by itself
            latest = None
        summary = {"algorithm": self.cfg.algo.name, "env_id": self.cfg.env.name,
                   "env_steps": self.env_steps, "updates": self.updates,
                   "wall_s": self.elapsed(), "best_return": self.gate.best_return,
                   "stop_reason": stop_reason, "error": reason,
                   "recoveries": self.recoveries, "latest_checkpoint": latest,
                   "run": self.run_name}
        for key in ("env_steps_discarded", "updates_discarded", "replay_lost"):
            if hasattr(self, key):
                summary[key] = getattr(self, key)
        if hasattr(self, "metrics"):
            try:
                self.metrics.write("run", {"event": "failed", **summary})
            except ValueError:  # its file is closed (the driver ended): summary.json still says
                logger.debug("the failure not in metrics.jsonl", exc_info=True)
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

    # ---- interrupts ----------------------------------------------------------------------------
    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop soon (Ctrl-C, or a sweep pruning the run with ``reason="pruned"``): no new
        work, a final checkpoint and summary, no final evaluation when one exists already.
        Safe to call from a signal handler and from another thread.

        An interrupt (``reason="interrupted"``) also starts the clock of :attr:`interrupted`:
        the run then ends within :data:`INTERRUPT_DEADLINE_S` whatever is in flight, without
        new evaluations or recoveries (its workers may be going), and says ``interrupted``
        even if it was already ending on a budget (that end is cut short) — not if solved."""
        if reason == "interrupted" and self.interrupted_at is None:
            self.interrupted_at = time.monotonic()
            if self.stop_reason in ("env_steps", "wall_s"):
                self.stop_reason = reason
        if self.stop_reason is None:
            self.stop_reason = reason

    @property
    def interrupted(self) -> bool:
        """Interrupted: the end runs on the interrupt's clock (:meth:`wait_for`)."""
        return self.interrupted_at is not None

    def _cut(self, timeout: float | None, start: float) -> tuple[float | None, bool]:
        """When a wait begun at ``start`` must end, and whether that is the interrupt's cut."""
        end = None if timeout is None else start + timeout
        if self.interrupted_at is None:
            return end, False
        cut = self.interrupted_at + self.abandon_after
        return (cut, True) if end is None or cut < end else (end, False)

    def wait_for(self, fut, timeout: float | None = None):
        """``fut.result(timeout)`` of a Dask or actor future, given up :attr:`abandon_after`
        seconds after an interrupt (also one that comes while it waits): then
        :class:`Abandoned`. Its own timeout raises TimeoutError as ``result`` does."""
        start = time.monotonic()
        while True:
            end, cut = self._cut(timeout, start)
            step = POLL_S if end is None else min(POLL_S, end - time.monotonic())
            if step <= 0:
                if fut.done():   # finished meanwhile: its result or its error
                    return fut.result()
                if cut:
                    raise Abandoned("interrupted while waiting for a result")
                raise TimeoutError(f"no result within {timeout} s")
            try:
                if isinstance(fut, Future):
                    # distributed's Future.result(timeout) can fail with UnboundLocalError
                    # when its wait times out (dask/distributed#8514): wait, then take it
                    wait([fut], timeout=step)
                    return fut.result()
                return fut.result(timeout=step)
            except TimeoutError:
                if fut.done():   # the task's own TimeoutError, or done just after the wait
                    return fut.result()

    def wait_all(self, futures: list, timeout: float | None = None, *,
                 first_error: bool = False) -> None:
        """``distributed.wait(futures, timeout)`` of Dask futures, given up like
        :meth:`wait_for`; with ``first_error``, also done as soon as one has failed (as
        ``Client.gather`` raises)."""
        start = time.monotonic()
        while True:
            end, cut = self._cut(timeout, start)
            step = POLL_S if end is None else min(POLL_S, end - time.monotonic())
            if all(f.done() for f in futures) or (
                    first_error and any(f.status == "error" for f in futures)):
                return
            if step <= 0:
                if cut:
                    raise Abandoned("interrupted while waiting for tasks")
                raise TimeoutError(f"{sum(not f.done() for f in futures)} tasks not done "
                                   f"within {timeout} s")
            try:
                wait(futures, timeout=step)
                return
            except TimeoutError:
                pass

    # ---- progress and the end ---------------------------------------------------------------
    def report_progress(self, *, env_steps: int | None = None, total: int | None = None,
                        recent_return: float | None = None, updates: int | None = None,
                        steps_per_s: float | None = None,
                        eval_return: float | None = None) -> None:
        """Tell the progress callback where the run stands (defaults: this run's counters)."""
        if self.progress is None:
            return
        gate = self.gate
        last = gate.last_eval.mean_return if gate.last_eval is not None else None
        self.progress(Progress(
            env_steps=self.env_steps if env_steps is None else env_steps,
            total=self.cfg.stop.env_steps if total is None else total,
            recent_return=self.recent_return() if recent_return is None else recent_return,
            updates=self.updates if updates is None else updates,
            steps_per_s=self.steps_per_s() if steps_per_s is None else steps_per_s,
            eval_return=last if eval_return is None else eval_return,
            dashboard=self.dashboard, screenings=tuple(gate.screenings)))

    def end(self, summary: RunSummary, *, omit: tuple[str, ...] = (),
            extra: dict[str, Any] | None = None) -> RunSummary:
        """Write the run's end record (the summary, less the ``omit`` keys); returns it.
        ``extra``: more keys for ``summary.json`` (an interrupted run's ``final_checkpoint``)."""
        if extra:
            summary = _with_extra(summary, extra)
        record = {k: v for k, v in summary.to_dict().items() if k not in omit}
        self.metrics.write("run", {"event": "end", **record})
        self.ended = True
        return summary

    def close(self) -> None:
        # the last records (the end's) reach the dashboard before the client may close
        if not self.events.flush(EVENTS_FLUSH_S if self.interrupted_at is None else 0.5):
            logger.debug("closing with records for the scheduler still queued")
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
