"""The parameter actor: the one long-lived owner of the policy's parameters.

It runs as a Dask actor (``client.submit(ParameterActor, ..., actor=True)``) on one worker and
knows flat parameter vectors, versions, an optimizer and an aggregation strategy — nothing about
PPO or ES. Learner tasks call :meth:`pull_learner` and :meth:`push`; rollout tasks call :meth:`pull`
with the version they already hold, which answers ``None`` when nothing changed.

Every published version is an immutable :class:`~dask_rl.data.PolicySnapshot`: applying an
update builds new arrays instead of writing into old ones, so a snapshot handed to a task on
the same worker (no serialisation) never changes under it, and the last few versions stay
available for Stellaris' importance-sampling truncation.

Dask runs an actor's methods on one thread; tasks on its own worker call it in-process
(:class:`ActorHandle`) and other workers' trips may come over its channel's threads
(:mod:`dask_rl.runtime.channel`), so every public method holds ``self.lock``. Calls may arrive
out of order; each push carries the version its learner pulled, all the strategy needs.
Pushes the actor has taken are refused again (:mod:`dask_rl.runtime.exactly_once`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from dask_rl.algos.optim import make_optimizer, mean_adam_state
from dask_rl.data import PolicySnapshot, PushAck
from dask_rl.models.normalizer import merge_moments
from dask_rl.runtime.actor_counters import Counters
from dask_rl.runtime.channel import ChannelServer, open_channel
from dask_rl.runtime.combiner import TripAnswers
from dask_rl.runtime.exactly_once import ExactlyOnce
from dask_rl.staleness import Arrival, Decision, make_strategy

logger = logging.getLogger(__name__)

# the calls a combined trip may carry (:meth:`ParameterActor.call_many`)
COMBINABLE = frozenset({"push", "pull", "pull_learner"})


def _locked(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)
    return wrapper


class ParameterActor:
    """Parameters, optimizer, strategy and version of one trainer.

    Parameters
    ----------
    params
        Initial flat float32 parameters.
    aggregation
        The pipeline's ``aggregation`` config (strategy name, step size ``alpha0``, ...).
    moments
        Initial running statistics (``{"obs": ..., "return": ...}``); pushes merge into them.
    keep_versions
        How many past versions to keep for IS truncation (0: only the current one).
    learners
        Learners allowed at once (lambda of n-softsync, the waiting bound of Stellaris).
    target_every
        Keep a target network, refreshed to the current parameters every this many updates
        (:attr:`~dask_rl.algos.base.Needs.target_network_every`); None keeps none.
    optimizer
        How aggregated gradients are applied: ``sgd`` (``theta -= alpha0 * g``) or ``adam``.
    run, epoch
        The run this actor serves and this incarnation's token (exactly-once pushes).
    """

    def __init__(self, params: np.ndarray, aggregation: Any, *,
                 moments: dict | None = None, keep_versions: int = 0,
                 optimizer: str = "sgd", learners: int = 1, target_every: int | None = None,
                 run: str | None = None, epoch: str | None = None):
        self.lock = threading.RLock()
        self.once = ExactlyOnce(run, epoch)
        self.counts = Counters()
        self.aggregation = aggregation
        self.strategy = make_strategy(aggregation, learners=learners)
        self.optimizer = make_optimizer(optimizer, np.zeros(len(params), np.float32))
        self.alpha0 = float(aggregation.alpha0)
        self.keep_versions = keep_versions
        self.current = PolicySnapshot(0, np.array(params, np.float32), moments or None)
        self.opt_state: dict | None = None
        self.target_every = target_every
        self.target = self.current.params if target_every else None
        # the observation statistics the target network was taken with: its policy is
        # pi_target only under the normaliser it had
        self.target_moments = self.current.moments if target_every else None
        self.history: OrderedDict[int, PolicySnapshot] = OrderedDict()
        self.learning: dict[str, int] = {}  # learners computing now -> version they pulled
        self.published: dict[str, np.ndarray] = {}  # their current local parameters
        self.exchange_skipped = 0
        self.gradients: dict[int, tuple[np.ndarray, dict | None]] = {}
        self.ids = itertools.count()
        self.apply_s = 0.0   # this incarnation's time gating and applying (not checkpointed)
        self.pushes = 0
        self.started = time.time()
        self.channel: ChannelServer | None = None
        self._remember(self.current)

    # ---- calls from tasks --------------------------------------------------------------------
    @_locked
    def pull(self, newer_than: int = -1, learner_id: str | None = None,
             learner_state: bool = False, min_versions: int = 1,
             opt_state: bool = True, slot: int | None = None) -> PolicySnapshot | None:
        """The current snapshot, or ``None`` if the caller already holds ``newer_than`` or a
        version fewer than ``min_versions`` behind the current one (TianJi's event-triggered
        pull: the parameters move only when they moved enough).

        A learner passes its id: it is then active (a sync barrier waits for it) until it pushes
        or is reported lost. ``learner_state`` adds the learners' Adam moments (unless
        ``opt_state`` is False) and the target network. A rollout slot passes its number: its
        pulls are counted apart (what event-triggered pulls cost).
        """
        cur = self.current
        if slot is not None:
            self.counts.rollout_pulls += 1
        if learner_id is not None:
            self.strategy.on_learner_started(learner_id, cur.version)
            self.learning[learner_id] = cur.version
        # a version behind the caller's (an exploit loaded another actor's state) always moves
        if newer_than >= 0 and 0 <= cur.version - newer_than < min_versions:
            self.counts.pulls_unchanged += 1
            return None
        self.counts.pulls_sent += 1
        if slot is not None:
            self.counts.rollout_loads += 1
        if learner_state:
            return PolicySnapshot(cur.version, cur.params, cur.moments,
                                  self.opt_state if opt_state else None, self.target,
                                  self.target_moments)
        return cur

    @_locked
    def pull_learner(self, learner_id: str, opt_state: bool = True) -> PolicySnapshot | None:
        """All a learner task needs, in one call: the current version with the learners'
        optimizer state (``opt_state``: ``learner.optimizer_state = shared``) and target
        network — or ``None`` while the strategy does not admit a new learner yet (SSP's read
        gate); the task asks again."""
        if not self.strategy.admit(learner_id):
            return None
        return self.pull(learner_id=learner_id, learner_state=True, opt_state=opt_state)

    @_locked
    def call_many(self, calls: list[tuple[str, tuple, dict]]) -> TripAnswers:
        """A :class:`~dask_rl.runtime.combiner.Combiner`'s trip: ``(method, args, kwargs)``
        of methods in :data:`COMBINABLE`, served under one hold of the lock, the pushes first,
        then the pulls, each in the given order. Each call gets the answer it would have got
        alone there, ``(True, result)`` or ``(False, exception)`` (only it fails), in the
        calls' order. A trip's calls come from different threads, so any order of them is
        one their callers could have met; pushes first gives all pulls the newest version,
        whose arrays then travel once in the answer."""
        unknown = {method for method, _, _ in calls} - COMBINABLE
        if unknown:
            raise ValueError(f"{', '.join(sorted(unknown))} calls are not combined")
        out: list[tuple[bool, Any] | None] = [None] * len(calls)
        for i in sorted(range(len(calls)), key=lambda i: calls[i][0] != "push"):
            method, args, kwargs = calls[i]
            try:
                out[i] = (True, getattr(self, method)(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - handed back to its own caller
                out[i] = (False, exc)
        return TripAnswers(out)

    @_locked
    def open_channel(self) -> tuple[tuple[str, int], bytes] | None:
        """The (address, token) of a channel to :meth:`call_many` (:mod:`~.channel`), or None."""
        if self.channel is None:
            self.channel = open_channel(self.call_many)
        return None if self.channel is None else (self.channel.address, self.channel.token)

    @_locked
    def expect_learners(self, learner_ids: list[str]) -> int:
        """The learners of a synchronous round, announced before their rollouts start."""
        for learner_id in learner_ids:
            self.strategy.on_learner_expected(learner_id)
        return self.current.version

    @_locked
    def exchange(self, learner_id: str, params: np.ndarray) -> list[np.ndarray]:
        """Stellaris' truncation: keep this learner's current local parameters and return the
        current ones of the other learners computing now (for one that has not published
        yet, the version it pulled; learners announced for a round but not started are not
        computing yet). Each learner calls it once per epoch."""
        if learner_id in self.learning:
            self.published[learner_id] = params
        others = []
        for other, version in self.learning.items():
            if other == learner_id:
                continue
            if other in self.published:
                others.append(self.published[other])
            elif version in self.history:
                others.append(self.history[version].params)
            else:
                self.exchange_skipped += 1  # its version left the history (keep_versions)
        return others

    @_locked
    def push(self, delta: np.ndarray, version: int, learner_id: str, *,
             opt_state: dict | None = None, moments: dict | None = None,
             finite_loss: bool = True, seq: int | None = None, epoch: str | None = None,
             run: str | None = None, samples: int = 0, sample_lag: int = 0) -> PushAck:
        """A learner's parameter delta (the strategy's *gradient*), computed on ``version``.
        Returns what became of it.

        ``seq`` (the task's sequence number in its run), ``epoch`` and ``run`` make the push
        exactly-once: a repeat, another epoch's or another run's push is ``refused`` (nothing
        of it is applied or merged). A delta with NaN or infinite values, of the wrong size, or
        from a learner whose loss was not finite is ``rejected``: counted, never applied.
        ``samples`` and ``sample_lag`` (versions from the policy that collected them to
        ``version``) tell the strategy how stale the gradient's data was (TianJi's ``P``).
        """
        t0 = time.perf_counter()
        self.pushes += 1
        refusal = self.once.refusal(seq, epoch, run)
        if refusal:
            self.counts.refused += 1
            logger.warning("refused a push from %s: %s", learner_id, refusal)
            # a re-run learner pulled again (and became active): nothing will come from it
            self._inactive(learner_id)
            self._execute(self.strategy.on_learner_released(learner_id))
            return PushAck("refused", self.current.version)
        self.once.taken(seq)
        self._inactive(learner_id)
        if moments and self.current.moments:
            # Statistics describe data, not the gradient: merge them whatever the gradient's fate.
            merged = {k: merge_moments(v, moments[k]) if k in moments else v
                      for k, v in self.current.moments.items()}
            self.current = PolicySnapshot(self.current.version, self.current.params, merged)
        problem = ("wrong shape" if delta.shape != self.current.params.shape
                   else "a non-finite loss" if not finite_loss
                   else "NaN or inf values" if not np.isfinite(delta).all() else None)
        if problem:
            self.counts.rejected += 1
            logger.warning("rejected a gradient from %s: %s", learner_id, problem)
            self._execute(self.strategy.on_learner_lost(learner_id))
            return PushAck("rejected", self.current.version)
        gid = next(self.ids)
        self.gradients[gid] = (delta, opt_state)
        staleness = self.strategy.version - version
        decisions = self.strategy.on_gradient(Arrival(gid, learner_id, version, int(samples),
                                                      int(sample_lag)))
        self._execute(decisions)
        self.apply_s += time.perf_counter() - t0
        weight = next((w for d in decisions for i, w in d.apply if i == gid), None)
        status = ("applied" if weight is not None
                  else "dropped" if any(gid in d.drop for d in decisions) else "buffered")
        return PushAck(status, self.current.version, staleness, weight)

    @_locked
    def ping(self) -> int:
        """The current version (the driver's heartbeat)."""
        return self.current.version

    @_locked
    def learner_lost(self, learner_id: str) -> int:
        """The driver saw a learner task fail: release any barrier waiting for it."""
        self._inactive(learner_id)
        self._execute(self.strategy.on_learner_lost(learner_id))
        return self.current.version

    @_locked
    def release_learners(self, learner_ids: list[str]) -> int:
        """Learners announced for a synchronous round that will never start (a replay whose
        trajectory is gone): barriers stop waiting for them; nothing is counted."""
        for learner_id in learner_ids:
            self._execute(self.strategy.on_learner_released(learner_id))
        return self.current.version

    @_locked
    def round_end(self, **signals: float) -> dict:
        """The driver finished a training round; returns the metrics after it."""
        t0 = time.perf_counter()
        self._execute(self.strategy.on_round_end(**signals))
        self.apply_s += time.perf_counter() - t0
        return self.metrics()

    @_locked
    def adopt(self, state: dict) -> int:
        """Take over another trainer's parameters, learners' optimizer state, statistics and
        target network (PBT's exploit step); counts as one update."""
        if np.asarray(state["params"]).shape != self.current.params.shape:
            raise ValueError("cannot adopt parameters of another shape")
        self._execute(self.strategy.on_replaced())
        self.current = PolicySnapshot(self.strategy.version,
                                      np.array(state["params"], np.float32),
                                      state.get("moments") or self.current.moments)
        self.opt_state = state.get("learner_opt")
        if self.target_every:
            if state.get("target") is not None:
                self.target = state["target"]
                self.target_moments = state.get("target_moments") or state.get("moments")
            else:
                self.target, self.target_moments = self.current.params, self.current.moments
        self._remember(self.current)
        return self.current.version

    @_locked
    def metrics(self) -> dict:
        """Strategy counters plus the actor's own (time spent gating and applying)."""
        m = self.strategy.metrics()
        assert m["version"] == self.current.version, "strategy and actor disagree"
        c = self.counts
        m.update({"gradients/rejected": c.rejected, "pushes/refused": c.refused,
                  "gradients/weight_sum": c.weight_sum, "actor/pulls_sent": c.pulls_sent,
                  "actor/pulls_unchanged": c.pulls_unchanged,
                  "actor/rollout_pulls": c.rollout_pulls, "actor/rollout_loads": c.rollout_loads,
                  "actor/apply_s": self.apply_s, "actor/pushes": self.pushes,
                  "pushes/distinct": len(self.once),
                  "actor/channel_trips": self.channel.trips if self.channel else 0,
                  "learners/exchange_skipped": self.exchange_skipped})
        return m

    # ---- checkpoint state --------------------------------------------------------------------
    @_locked
    def state_dict(self) -> dict:
        """Everything needed to re-create this actor: arrays and JSON-ready scalars."""
        cur = self.current
        optimizer = {k: (v.copy() if isinstance(v, np.ndarray) else v)
                     for k, v in self.optimizer.state_dict().items()}
        return {"params": cur.params, "version": cur.version, "moments": cur.moments,
                "optimizer": optimizer, "learner_opt": self.opt_state, "target": self.target,
                "target_moments": self.target_moments, "strategy": self.strategy.state_dict(),
                **self.counts.state(), "seen": self.once.state()}

    @_locked
    def load_state_dict(self, state: dict) -> int:
        """Restore from :meth:`state_dict`; buffered gradients and active learners are gone."""
        self.strategy.load_state_dict(state["strategy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.opt_state = state.get("learner_opt")
        if self.target_every:
            self.target = state.get("target")
            # a checkpoint from before the target kept its statistics: the current ones
            self.target_moments = state.get("target_moments") or state.get("moments")
        self.counts = Counters.from_state(state)
        self.once.load_state(state.get("seen", ()))
        self.current = PolicySnapshot(int(state["version"]), np.array(state["params"], np.float32),
                                      state.get("moments"))
        if self.target_every and self.target is None:
            self.target, self.target_moments = self.current.params, self.current.moments
        if self.current.version != self.strategy.version:
            raise ValueError(f"parameter version {self.current.version} does not match the "
                             f"strategy's version {self.strategy.version}")
        for gone in (self.gradients, self.learning, self.published, self.history):
            gone.clear()
        self._remember(self.current)
        return self.current.version

    # ---- executing decisions -----------------------------------------------------------------
    def _execute(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            for gid in decision.drop:
                self.gradients.pop(gid, None)
            if not decision.wait:
                self._apply(decision)

    def _apply(self, decision: Decision) -> None:
        """``theta -= alpha0 * sum_j w_j g_j`` into a new array (published snapshots never
        change), summed in the decision's order; a lone gradient of weight 1 (every push under
        async) is used as it is: no pass over memory is spent on a sum of one term."""
        cur = self.current
        g = None
        states = []
        for gid, weight in decision.apply:
            grad, opt_state = self.gradients.pop(gid)
            term = grad if weight == 1 else np.float32(weight) * grad
            g = term if g is None else g + term  # never in place: grad may be a caller's array
            self.counts.weight_sum += float(weight)
            if opt_state is not None:
                states.append(opt_state)
        if g is None:
            g = np.zeros_like(cur.params)
        params = self.optimizer.stepped(cur.params, g, self.alpha0)
        if states:
            self.opt_state = mean_adam_state(states)
        self.current = PolicySnapshot(cur.version + 1, params, cur.moments)
        if self.target_every and self.current.version % self.target_every == 0:
            self.target, self.target_moments = params, cur.moments
        self._remember(self.current)

    def _inactive(self, learner_id: str) -> None:
        """The learner computes no more: no barrier or truncation counts it."""
        self.learning.pop(learner_id, None)
        self.published.pop(learner_id, None)

    def _remember(self, snap: PolicySnapshot) -> None:
        self.history[snap.version] = snap
        while len(self.history) > self.keep_versions + 1:
            self.history.popitem(last=False)
