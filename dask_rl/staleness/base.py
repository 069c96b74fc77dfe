"""The interface every aggregation strategy implements: a sans-IO state machine.

Events go in — a learner started (and which version it pulled), a gradient arrived, a learner
was lost, a training round ended — and a list of :class:`Decision` s comes out: each names the
buffered gradients to combine into one update and their weights, or gradients to drop; an
empty list means wait. The parameter actor only stores the gradient arrays and executes
decisions, so each strategy is driven in tests by scripted event sequences, without a cluster.

The strategy owns the *version* (the number of updates applied so far): the staleness of a
gradient is the version when it is used minus the version its learner pulled.

Notes
-----
Subclass :class:`Strategy`, name its config class (an
:class:`~dask_rl.config.schema.AggregationConfig` whose ``strategy`` field is a ``Literal``) in
``config_class``, register it in :data:`dask_rl.staleness.STRATEGIES` (or with
:func:`dask_rl.staleness.register`), and implement :meth:`Strategy.decide`, which looks at the
buffer and returns one :class:`Decision` (or an empty one to wait); after every event it is
called again until it waits, so a strategy that releases one gradient per update (SSP) needs
no loop of its own. Call :meth:`Strategy._aggregate` to emit an update (it bumps the version
and records metrics) and :meth:`Strategy._drop` to discard gradients. Override ``on_*`` hooks
to track more state, calling ``super()``. ``synchronous = True`` tells the driver to gate
rollouts on updates (a synchronous baseline); every other strategy lets rollouts run freely.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

HIST_BINS = 32  # staleness histogram: 0..30 and ">= 31"


@dataclass(frozen=True)
class Arrival:
    """A gradient that reached the parameter actor."""

    id: int            # the actor's key for the gradient array
    learner_id: str
    version: int       # the parameter version the learner pulled
    samples: int = 0        # env steps the gradient learned from (0: not reported)
    sample_lag: int = 0     # versions from the policy that collected them to ``version``


@dataclass(frozen=True)
class Decision:
    """What to do now: one update from ``apply`` (if any), and gradients to discard.

    The update is ``g = sum_j weight_j * g_j`` over ``apply = ((id_j, weight_j), ...)``, applied
    as ``theta -= alpha0 * g``. Weights include any averaging (1/H) and staleness scaling.
    """

    apply: tuple[tuple[int, float], ...] = ()
    drop: tuple[int, ...] = ()

    @property
    def wait(self) -> bool:
        return not self.apply

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.apply)


WAIT = Decision()  # nothing to do now


@dataclass
class StrategyStats:
    """Counters every strategy keeps (reported in metrics and checkpointed)."""

    arrived: int = 0
    applied: int = 0
    dropped: int = 0
    updates: int = 0
    lost_learners: int = 0
    superseded: int = 0        # dropped: computed on parameters since replaced wholesale
    staleness_sum: float = 0.0
    staleness_max: int = 0
    histogram: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BINS, np.int64))

    @property
    def staleness_mean(self) -> float:
        return self.staleness_sum / self.applied if self.applied else 0.0


class Strategy(abc.ABC):
    """Base class: bookkeeping of active learners, the buffer and the version.

    Examples
    --------
    >>> s = make_strategy(AsyncConfig())
    >>> s.on_learner_started("L0", version=0)
    >>> s.on_gradient(Arrival(id=0, learner_id="L0", version=0))
    [Decision(apply=((0, 1.0),), drop=())]
    """

    name: ClassVar[str] = "base"
    config_class: ClassVar[type]
    synchronous: ClassVar[bool] = False

    def __init__(self, cfg: Any, *, learners: int = 1):
        self.cfg = cfg
        self.learners = max(1, learners)  # learners allowed at once
        self.version = 0
        self.round = 0
        self.active: dict[str, int] = {}      # learner id -> version it pulled
        self.buffer: dict[int, Arrival] = {}  # gradient id -> arrival, in arrival order
        self.valid_from = 0  # gradients computed on older versions are dropped (PBT exploit)
        self.stats = StrategyStats()
        self.last_update: dict[str, Any] = {}

    # ---- events ------------------------------------------------------------------------------
    def admit(self, learner_id: str) -> bool:
        """May a learner pull now? (SSP's read gate says no while it would run too far ahead
        of the slowest learner; every other strategy admits at once.)"""
        return True

    def on_learner_expected(self, learner_id: str) -> None:
        """A learner of the current round will pull later: barriers wait for it too.

        The driver announces a synchronous round's learners when it starts the round's
        rollouts, so that a barrier cannot close before a learner it does not know of yet has
        even been launched.
        """
        self.active[learner_id] = self.version

    def on_learner_started(self, learner_id: str, version: int) -> None:
        """A learner pulled ``version`` and is computing a gradient."""
        self.active[learner_id] = version

    def on_gradient(self, arrival: Arrival) -> list[Decision]:
        """A gradient arrived; its learner is finished."""
        self.active.pop(arrival.learner_id, None)
        self.stats.arrived += 1
        self.buffer[arrival.id] = arrival
        if arrival.version < self.valid_from:
            self.stats.superseded += 1
            return [self._drop((arrival.id,)), *self._drain()]
        return self._drain()

    def on_learner_released(self, learner_id: str) -> list[Decision]:
        """A learner finished with nothing to give (its push repeated one already taken):
        barriers stop waiting for it; nothing is counted."""
        self.active.pop(learner_id, None)
        return self._drain()

    def on_learner_lost(self, learner_id: str) -> list[Decision]:
        """A learner died without pushing; barriers must not wait for it."""
        if self.active.pop(learner_id, None) is not None:
            self.stats.lost_learners += 1
        return self._drain()

    def on_replaced(self) -> list[Decision]:
        """The parameters were replaced wholesale (population-based training's exploit).

        Buffered gradients were computed on weights that no longer exist: they are dropped,
        and so is every gradient that arrives later from a learner that pulled before the
        replacement (counted as ``superseded``). The replacement counts as one update.
        """
        drop = self._drop(tuple(self.buffer)) if self.buffer else None
        if drop:
            self.stats.superseded += len(drop.drop)
        self.version += 1
        self.stats.updates += 1
        self.valid_from = self.version  # learners still computing learn from the old weights
        return [drop] if drop else []

    def on_round_end(self, **signals: float) -> list[Decision]:
        """The driver finished a training round (one batch per rollout slot).

        ``signals`` carry what the driver measured (e.g. ``reward``, the recent mean return);
        strategies that adapt to them read what they need.
        """
        self.round += 1
        return self._drain()

    # ---- the decision rule -------------------------------------------------------------------
    @abc.abstractmethod
    def decide(self) -> Decision:
        """One step of the rule: an update, a drop, or an empty Decision to wait."""

    def _drain(self) -> list[Decision]:
        out: list[Decision] = []
        while True:
            d = self.decide()
            if d.wait and not d.drop:
                return out
            out.append(d)

    # ---- helpers for subclasses --------------------------------------------------------------
    def staleness(self, arrival: Arrival) -> int:
        return self.version - arrival.version

    def _aggregate(self, weights: dict[int, float], drop: tuple[int, ...] = (),
                   **info: Any) -> Decision:
        """Emit one update from ``weights`` (gradient id -> weight) and advance the version."""
        stal = [self.staleness(self.buffer[i]) for i in weights]
        for i in (*weights, *drop):
            del self.buffer[i]
        st = self.stats
        st.applied += len(weights)
        st.dropped += len(drop)
        st.updates += 1
        st.staleness_sum += float(sum(stal))
        st.staleness_max = max([st.staleness_max, *stal])
        np.add.at(st.histogram, np.minimum(stal, HIST_BINS - 1), 1)
        self.last_update = {"staleness": stal, "weights": list(weights.values()), **info}
        self.version += 1
        return Decision(apply=tuple(weights.items()), drop=tuple(drop))

    def _drop(self, ids: tuple[int, ...]) -> Decision:
        for i in ids:
            del self.buffer[i]
        self.stats.dropped += len(ids)
        return Decision(drop=tuple(ids))

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain data (JSON scalars and numpy arrays) restoring this strategy."""
        st = dataclasses.asdict(self.stats)
        return {"name": self.name, "version": self.version, "round": self.round,
                "valid_from": self.valid_from,
                "stats": {k: v for k, v in st.items() if k != "histogram"},
                "histogram": self.stats.histogram.copy(), **self._extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"strategy state is for {state.get('name')!r}, not {self.name!r}")
        self.version = int(state["version"])
        self.round = int(state["round"])
        self.valid_from = int(state.get("valid_from", 0))
        self.stats = StrategyStats(**state["stats"],
                                   histogram=np.asarray(state["histogram"], np.int64).copy())
        # In-flight learners and buffered gradients died with the old actor.
        self.active.clear()
        self.buffer.clear()
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        """Scalars for metrics.jsonl and the dashboard."""
        st = self.stats
        return {"staleness/mean": st.staleness_mean, "staleness/max": st.staleness_max,
                "staleness/histogram": st.histogram.tolist(),
                "gradients/arrived": st.arrived, "gradients/applied": st.applied,
                "gradients/dropped": st.dropped, "gradients/superseded": st.superseded,
                "gradients/buffered": len(self.buffer),
                "learners/active": len(self.active), "version": self.version,
                "round": self.round, "lr_scale": self.last_update.get("lr_scale", 1.0)}
