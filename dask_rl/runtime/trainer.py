"""A run with a parameter actor: create it, checkpoint it, restore it, recover it.

:class:`Trainer` is the base of the asynchronous learners' driver and of the ES driver. On top
of :class:`~dask_rl.runtime.run.Run` it registers the run's worker plugin, creates the
supervised parameter actor, recovers a lost actor to the latest checkpoint (its
:class:`~dask_rl.runtime.checkpoints.Checkpoints` write and load them), watches the actor's
heartbeat, and assembles the part of the summary every trainer shares.

Notes
-----
Subclasses implement :meth:`initial_params` and :meth:`Run.run`, and may override hooks that do
nothing by default: :meth:`actor_options` and :meth:`plugin_options`, :meth:`driver_state` /
:meth:`load_driver_state` (their counters in checkpoints), :meth:`write_extra` /
:meth:`restore_extra` (bulk state written by workers) and :meth:`on_actor_lost` (drop work in
flight before the actor is replaced).
"""

from __future__ import annotations

import abc
import collections
import logging
import threading
import time
from typing import Any

import numpy as np

from dask_rl.checkpoint import Pending
from dask_rl.data import Evaluation
from dask_rl.envs import env_spaces, space_to_dict
from dask_rl.runtime.checkpoints import Checkpoints
from dask_rl.runtime.cluster import rl_page
from dask_rl.runtime.handle import ActorHandle
from dask_rl.runtime.housekeeping import Housekeeper
from dask_rl.runtime.plugins import RunState
from dask_rl.runtime.run import INTERRUPT_DEADLINE_S, Abandoned, Run
from dask_rl.runtime.supervisor import ActorSupervisor

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 5  # tasks of one kind (or ES generations) failing in a row end a run
# An interrupted run's end, in seconds after the signal (Run.abandon_after): after the final
# checkpoint (checkpoints.FINAL_CHECKPOINT_BY_S), the actor's final metrics are given up by this
# mark; the summary then needs no cluster.
FINAL_METRICS_BY_S = INTERRUPT_DEADLINE_S - 3.0
RELEASE_WAIT_S = 2.0  # an interrupted run's release of its worker plugin, at most


class Trainer(Run):
    """A run whose parameters live in one supervised parameter actor (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.loss_times: collections.deque[float] = collections.deque()
        # what recoveries threw away (checkpointed with the driver's counters)
        self.env_steps_discarded = 0
        self.updates_discarded = 0
        self.replay_lost = 0
        self.checkpoints = Checkpoints(self)
        self.rolled_back_at = 0  # env steps at the last rollback
        self._spaces: dict[str, Any] | None = None

    # ---- hooks ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def initial_params(self) -> tuple[np.ndarray, dict | None]:
        """The actor's initial flat parameters and running statistics."""

    def actor_options(self) -> dict[str, Any]:
        """How the actor applies updates: ``optimizer``, ``aggregation``, ``target_every``."""
        return {}

    def plugin_options(self) -> dict[str, Any]:
        """What the run's worker plugin needs beyond the pipeline (ES: ``noise``)."""
        return {}

    def driver_state(self) -> dict[str, Any]:
        return {}

    def spaces(self) -> dict[str, Any]:
        """The env's observation and action spaces as the model sees them, described for the
        checkpoint's meta (:func:`dask_rl.load_policy` builds the policy from them)."""
        if self._spaces is None:
            obs_space, action_space = env_spaces(self.cfg.env)
            self._spaces = {"observation": space_to_dict(obs_space),
                            "action": space_to_dict(action_space)}
        return self._spaces

    def load_driver_state(self, state: dict[str, Any]) -> None:
        pass

    def write_extra(self, pending: Pending) -> tuple[list[dict[str, int]], dict]:
        """Bulk state written by workers into a pending checkpoint: the checksums of each
        trajectory written (:func:`~dask_rl.checkpoint.write_trajectory`), and meta. Raise
        if any write failed: the checkpoint is then not published."""
        return [], {}

    def restore_extra(self, name: str, meta: dict[str, Any]) -> None:
        pass

    def on_actor_lost(self, reason: str) -> None:
        """Recover from a lost actor; drivers with work in flight drop it first."""
        self.replace_actor(reason)

    # ---- opening -------------------------------------------------------------------------------
    def _register_plugin(self, plugin: RunState, attempts: int = 3) -> None:
        """Register the run's worker plugin. The scheduler keeps it for every worker that joins
        and broadcasts it to those running; a worker that leaves during the broadcast (an
        adaptive cluster retiring one as the run starts) fails the broadcast, not the
        registration, so it is sent again."""
        for attempt in range(attempts):
            try:
                self.client.register_plugin(plugin, name=self.run_name)
                return
            except OSError as e:   # distributed's CommClosedError is an OSError
                if attempt == attempts - 1:
                    raise
                logger.info("a worker left while the run's plugin was sent (%s); again", e)
                time.sleep(0.5)

    def open(self) -> None:
        cfg = self.cfg
        self.open_run()
        params, moments = self.initial_params()
        self.num_params = len(params)
        if self.interrupted:  # before there was anything to save: nothing is started
            raise Abandoned("interrupted before the run started")
        self._register_plugin(RunState(self.run_name, cfg, **self.plugin_options()))
        self.dashboard = rl_page(self.client)
        self.housekeeper = Housekeeper(self.client)
        if self.dashboard:
            logger.info("dashboard: %s", self.dashboard)
        if self.interrupted:  # before there was anything to save: nothing is started
            raise Abandoned("interrupted before the parameter actor was created")
        self.supervisor = ActorSupervisor(self.client, cfg, self.run_name, params,
                                          moments=moments, wait=self.wait_for,
                                          **self.actor_options())
        if self.resume:
            self.checkpoints.resume()
        elif self.checkpoints.write() is None:  # recovery always has a checkpoint to return to
            raise RuntimeError(f"cannot write the first checkpoint to {self.store.root}")
        self.checkpoints.last = time.monotonic()

    @property
    def actor(self) -> ActorHandle:
        return self.supervisor.handle

    # ---- the actor -----------------------------------------------------------------------------
    def actor_call(self, method: str, *args, on_loss: str = "retry", **kwargs):
        """Call the parameter actor from the driver: the one place that does.

        If the call fails and the actor does not answer a ping, the actor is recovered from
        the latest checkpoint (:meth:`on_actor_lost`) and the call is retried on the new actor
        (``on_loss="retry"``) or skipped, returning None (``on_loss="skip"``: calls whose
        purpose died with the old actor, such as releasing a lost learner). A failure of a live
        actor is the method's own error and is raised.
        """
        self.hooks.actor_call(self, method)
        for attempt in range(self.cfg.checkpoint.max_recoveries + 1):
            try:
                # the driver's call, polled so that an interrupt cuts it short
                return self.wait_for(self.actor.submit(method, *args, **kwargs),
                                     self.actor.timeout)
            except Abandoned:
                raise
            except Exception as e:  # lost worker, closed comm, timeout, cancelled actor...
                if self.interrupted:  # no recovery on a cluster that may be going
                    raise Abandoned(f"the parameter actor did not answer {method} "
                                    f"({type(e).__name__})") from e
                if self.supervisor.alive(timeout=min(5.0, self.cfg.checkpoint.actor_timeout_s)):
                    raise
                self.on_actor_lost(f"the parameter actor is gone ({type(e).__name__} during "
                                   f"{method})")
                if on_loss == "skip":
                    return None
        raise self.fail(f"the parameter actor was lost at each of "
                        f"{self.cfg.checkpoint.max_recoveries + 1} attempts to call {method}",
                        "crash_loop")

    def check_heartbeat(self) -> None:
        """Every ``checkpoint.heartbeat_s``: recover an actor that does not answer (and give
        up at once if the scheduler is gone)."""
        self.check_scheduler()
        if self.interrupted:  # a missed beat now is the workers going: nothing to recover
            return
        if not self.supervisor.heartbeat_due():
            return
        self.hooks.heartbeat(self)
        if not self.supervisor.alive():
            self.on_actor_lost("the parameter actor missed its heartbeat")

    def replace_actor(self, reason: str) -> str:
        """Re-create a lost or hung parameter actor from the latest checkpoint.

        What the rollback throws away is counted: the updates applied since the checkpoint
        and the env steps their learners learned from. More than ``checkpoint.max_recoveries``
        losses within ``checkpoint.recovery_window_s`` (a crash loop) end the run with a
        RuntimeError naming the cause. An interrupted run recovers nothing: its workers may be
        going (:class:`~dask_rl.runtime.run.Abandoned`).
        """
        if self.interrupted:
            raise Abandoned(f"interrupted; not recovering: {reason}")
        self.check_scheduler()
        self._count_loss(reason)
        self.recoveries += 1
        logger.warning("recovery %d: %s", self.recoveries, reason)
        before, steps_before = self.updates, self.env_steps
        while True:  # the new actor's worker may die while it is made or loaded: another loss
            try:
                self.supervisor.replace()
                state, _, name = self.checkpoints.load()
                break
            except Exception as e:
                if self.interrupted:
                    raise Abandoned(f"interrupted; not recovering: {reason}") from e
                if self.supervisor.alive(timeout=5.0):
                    raise
                logger.warning("the new parameter actor was lost while loading; again")
                self._count_loss(f"the new parameter actor was lost while loading "
                                 f"({type(e).__name__}: {e})")
        # Env steps are not rolled back (the budget counts what was collected): what a rollback
        # loses is what was learned since the checkpoint, or since the last rollback to it.
        kept_steps = max(int(state["driver"]["env_steps"]), self.rolled_back_at)
        self.rolled_back_at = steps_before
        self.updates_discarded += max(before - self.updates, 0)
        self.env_steps_discarded += max(steps_before - kept_steps, 0)
        if self.updates < before:
            self.gate.policy_lost()
        self.metrics.write("recovery", {"reason": reason, "checkpoint": name,
                                        "version_lost": before, "version": self.updates,
                                        "env_steps": self.env_steps,
                                        "env_steps_discarded": steps_before - kept_steps,
                                        "recoveries": self.recoveries,
                                        "actor_worker": self.supervisor.address})
        return name

    def _count_loss(self, reason: str) -> None:
        """One more loss of the parameter actor: more than ``checkpoint.max_recoveries``
        within ``checkpoint.recovery_window_s`` (a crash loop) end the run with a
        RuntimeError naming the last cause."""
        cfg = self.cfg.checkpoint
        now = time.monotonic()
        self.loss_times.append(now)
        while self.loss_times and now - self.loss_times[0] > cfg.recovery_window_s:
            self.loss_times.popleft()
        if len(self.loss_times) > cfg.max_recoveries:
            raise self.fail(
                f"the parameter actor was lost {len(self.loss_times)} times within "
                f"{cfg.recovery_window_s:g} s (checkpoint.max_recoveries={cfg.max_recoveries}); "
                f"last: {reason}", "crash_loop")

    # ---- the end -------------------------------------------------------------------------------
    def final_actor_metrics(self) -> dict[str, Any]:
        """The actor's metrics for the summary; an interrupted run whose actor does not answer
        by ``FINAL_METRICS_BY_S`` after the signal gets what the driver knows instead (None for
        what only the actor knows)."""
        if not self.interrupted:
            return self.actor_call("metrics")
        self.abandon_after = FINAL_METRICS_BY_S
        try:
            if hasattr(self, "supervisor") and not self.actor_worker_gone():
                return self.actor_call("metrics")
        except Exception as e:
            logger.warning("the parameter actor did not give its final metrics (%s); the "
                           "summary has the driver's counters", type(e).__name__)
        return {"version": self.updates, "staleness/mean": None, "staleness/max": None,
                "staleness/histogram": [], "gradients/applied": None,
                "gradients/dropped": None, "gradients/rejected": None,
                "gradients/weight_sum": None, "pushes/refused": None, "actor/apply_s": None,
                "actor/rollout_pulls": None, "actor/rollout_loads": None}

    def actor_worker_gone(self) -> bool:
        """Whether the scheduler has lost the actor's worker (a call to it would retry its
        connection for Dask's connect timeout, 30 s, before failing)."""
        try:
            return self.supervisor.address not in self.client.nthreads()
        except Exception:  # the scheduler does not answer either
            return True

    def interrupted_extra(self, written: str | None) -> dict[str, Any] | None:
        """An interrupted run's ``summary.json`` keys: whether its final checkpoint was
        written, and the newest there is."""
        if not self.interrupted:
            return None
        try:
            latest = self.store.latest() if hasattr(self, "store") else None
        except Exception:  # a damaged pointer: --resume falls back by itself
            latest = None
        return {"final_checkpoint": written is not None, "latest_checkpoint": latest}

    def trainer_summary(self, final: Evaluation | None,
                        actor_metrics: dict | None = None) -> dict[str, Any]:
        """The fields of :class:`~dask_rl.data.summary.TrainerSummary` (the caller wrote the
        final checkpoint), from ``actor_metrics`` (the actor's final metrics, asked for if
        not given). ``final`` is None for an interrupted run without an evaluation."""
        actor_metrics = actor_metrics or self.final_actor_metrics()
        wall = self.elapsed()
        apply_s = actor_metrics["actor/apply_s"]
        try:
            threads = sum(self.client.nthreads().values())
        except Exception:  # an interrupted run's cluster may be going
            if not self.interrupted:
                raise
            threads = 0
        return {
            "algorithm": self.cfg.algo.name, "env_id": self.cfg.env.name,
            "env_steps": self.env_steps, "updates": actor_metrics["version"], "wall_s": wall,
            "final_return": final.mean_return if final is not None else None,
            "best_return": self.gate.best_return,
            "target_return": self.gate.target,
            "solved": self.gate.solved(),
            "confirmation": self.gate.confirmation.record() if self.gate.confirmation else None,
            "stop_reason": self.stop_reason,
            "staleness_mean": actor_metrics["staleness/mean"],
            "staleness_max": actor_metrics["staleness/max"],
            "recoveries": self.recoveries, "run": self.run_name,
            "steps_per_s": self.steps_per_s(),
            "final_return_std": final.std_return if final is not None else None,
            "staleness_histogram": actor_metrics["staleness/histogram"],
            "gradients_applied": actor_metrics["gradients/applied"],
            "gradients_dropped": actor_metrics["gradients/dropped"],
            "gradients_rejected": actor_metrics["gradients/rejected"],
            "step_per_gradient": self.step_per_gradient(actor_metrics),
            "pushes_refused": actor_metrics["pushes/refused"],
            "env_steps_discarded": self.env_steps_discarded,
            "updates_discarded": self.updates_discarded, "replay_lost": self.replay_lost,
            "episodes": self.episodes,
            "actor_apply_share": apply_s / max(wall, 1e-9) if apply_s is not None else None,
            "worker_threads": threads,
        }

    def step_per_gradient(self, actor_metrics: dict) -> float | None:
        """The strategy's effective step: alpha0 times the mean weight an applied gradient got
        (1 under async and SSP; 1/H when H gradients are averaged; Stellaris' staleness
        scaling on top). None before any gradient was applied."""
        applied = actor_metrics["gradients/applied"]
        if not applied:
            return None
        alpha0 = self.actor_options().get("aggregation", self.cfg.aggregation).alpha0
        return alpha0 * actor_metrics["gradients/weight_sum"] / applied

    def close(self, inflight: list | None = None) -> None:
        def release() -> None:
            try:
                if inflight:
                    self.client.cancel(inflight)
                self._release_tasks()
                if hasattr(self, "supervisor"):
                    self.supervisor.close()
                self.client.unregister_worker_plugin(self.run_name)
            except Exception:
                logger.debug("closing the run", exc_info=True)

        if self.interrupted:
            # workers that are going hold the plugin's removal up for the comms' timeouts (10 s
            # measured): it is tried, not waited for; closing the cluster still needs the time
            helper = threading.Thread(target=release, daemon=True, name="dask-rl-release")
            helper.start()
            helper.join(RELEASE_WAIT_S)
        else:
            release()
        super().close()

    def _release_tasks(self) -> None:
        """Every task of this run that the client still holds is released, and with it the
        data it left on the workers (trajectories, a replay buffer): a run on a user's cluster
        leaves nothing there when it ends. The driver's parts refer to one another, so without
        this their futures would stay until Python's cycle collector happened to run. The
        run's keys end with its name; tasks without a key of their own depend on those and go
        with them. The parameter actor is the supervisor's to close."""
        from distributed import Future

        suffix = f"-{self.run_name}"
        keys = [k for k in list(self.client.futures)
                if isinstance(k, str) and k.endswith(suffix)
                and not k.startswith("parameter-actor-")]
        if keys:
            self.client.cancel([Future(k, self.client) for k in keys])
