"""TianJi's resource allocation: balance learner and actor throughput, as a linear program.

TianJi (notes, Sec. 2.3.2) allocates cores to learners and actors (our rollouts) to

    maximise  min(T_RL, T_RA)
    s.t.      the sample-staleness bound,   M_L + M_A <= M,

with ``T_RL`` the learners' and ``T_RA`` the actors' throughput (samples per second). With
measured per-slot rates — ``r_L`` samples/s one learner consumes, ``r_A`` samples/s one rollout
slot produces — the throughputs are linear in the slot counts, and the max-min is the LP

    maximise z
    s.t.      z <= r_L n_L,   z <= r_A n_A,   n_L + n_A <= M,
              1 <= n_L <= L_max,   n_A >= 1,

where ``L_max`` is the staleness bound on concurrent learners: with ``n_L`` learners in flight
a gradient arrives about ``n_L - 1`` versions stale (each other learner pushes once meanwhile),
so a mean-staleness bound ``S`` admits ``n_L <= S + 1``. Solved with
``scipy.optimize.linprog`` (HiGHS); the integer allocation is the best of the LP optimum's
floor/ceiling neighbours that fits (the LP has two slot variables, so that search is four
points).

Deviation: the notes bound the *sample* staleness (``N_c / N_s <= P``); this LP bounds the
*version* staleness of concurrent learners instead (``n_L <= S + 1``), the bound that applies
to the asynchronous gradient learners whose allocation it balances. For replay learners the
notes' bound maps to ``n_L B_s / N_s <= P_tol``, i.e. ``L_max = floor(P_tol N_s / B_s)``,
passed the same way.

Where it is used: the adaptive scaling policy (:func:`dask_rl.control.scaling.lp_allocation`)
solves it for each asynchronous trainer with per-slot rates in trajectories per second (a rollout
task produces one, a learner task consumes one), ``M`` the cluster's thread limit and ``L_max``
the trainer's ``learner.max_learners``; the driver runs the allocation's actor count as its
rollout slots. Replay learners (DQN) are not allocated by it yet: their learners draw samples,
not trajectories, and the replay ratio already holds rollouts back to what they learn.

The notes' operating rules, on the measured sample-staleness ratio ``P`` (TianJi Sec. 5.2):
``P > 0.3``: learners are the bottleneck, add learners; ``P < 0.1``: learners idle on small
batches, enlarge the batch. :func:`operating_rule` states which applies.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

MORE_LEARNERS_ABOVE = 0.3   # TianJi's tuning guide: staleness ratio above this, more learners
LARGER_BATCH_BELOW = 0.1    # ... below this, a larger batch


@dataclass(frozen=True)
class Allocation:
    learners: int            # n_L
    actors: int              # n_A, rollout slots
    learner_rate: float      # T_RL = r_L n_L, samples/s
    actor_rate: float        # T_RA = r_A n_A
    lp_learners: float       # the LP's continuous optimum, before rounding
    lp_actors: float
    bound: str               # "balance" (every slot, T_RL = T_RA), "staleness" (n_L capped)
    #                          or "floor" (one learner outpaces every other slot's actors)

    @property
    def throughput(self) -> float:
        """``min(T_RL, T_RA)``: the rate the pipeline trains at."""
        return min(self.learner_rate, self.actor_rate)


CHANGE_GAIN = 0.1  # a new allocation replaces the running one when it trains >10% faster


def learner_cap(slots: int, max_learners: int | None) -> int:
    """The most learners ``slots`` allow: one slot stays an actor's, and the staleness bound
    ``max_learners`` (None: none) caps them, but never below one."""
    return slots - 1 if max_learners is None else max(1, min(max_learners, slots - 1))


def trained_rate(n_l: int, n_a: int, learner_rate: float, actor_rate: float) -> float:
    """``min(T_RL, T_RA) = min(r_L n_L, r_A n_A)`` for per-slot rates: what the pipeline
    trains at with ``n_l`` learners and ``n_a`` actors."""
    return min(n_l * learner_rate, n_a * actor_rate)


def balance(*, learner_rate: float, actor_rate: float, slots: int,
            max_learners: int | None = None) -> Allocation:
    """The allocation of ``slots`` between learners and actors maximising
    ``min(T_RL, T_RA)``; ``learner_rate``/``actor_rate`` are per-slot samples/s and
    ``max_learners`` the staleness bound on concurrent learners (None: none)."""
    if learner_rate <= 0 or actor_rate <= 0:
        raise ValueError(f"rates must be > 0, got learner {learner_rate}, actor {actor_rate}")
    if slots < 2:
        raise ValueError(f"need at least 2 slots (a learner and an actor), got {slots}")
    cap = learner_cap(slots, max_learners)
    # x = [n_L, n_A, z]: first the best throughput z* (linprog minimises, so -z) ...
    a_ub = [[-learner_rate, 0.0, 1.0], [0.0, -actor_rate, 1.0], [1.0, 1.0, 0.0]]
    b_ub = [0.0, 0.0, float(slots)]
    bounds = [(1.0, float(cap)), (1.0, None), (0.0, None)]
    best_z = _solve(c=[0.0, 0.0, -1.0], A_ub=a_ub, b_ub=b_ub, bounds=bounds).x[2]
    # ... then, of the allocations reaching it, the fewest slots: when the staleness bound
    # caps the learners, more actors would only queue trajectories. Two solves, not a small
    # tie-break cost: one far below the throughputs falls under the solver's tolerance.
    res = _solve(c=[1.0, 1.0, 0.0], A_ub=a_ub, b_ub=b_ub,
                 bounds=[*bounds[:2], (best_z * (1 - 1e-9), None)])
    lp_l, lp_a = float(res.x[0]), float(res.x[1])
    best = None
    for n_l, n_a in itertools.product({math.floor(lp_l), math.ceil(lp_l)},
                                      {math.floor(lp_a), math.ceil(lp_a)}):
        if not (1 <= n_l <= cap and n_a >= 1 and n_l + n_a <= slots):
            continue
        score = (trained_rate(n_l, n_a, learner_rate, actor_rate), -(n_l + n_a))
        if best is None or score > best[0]:
            best = (score, n_l, n_a)
    assert best is not None  # (1, 1) is among the neighbours whenever the LP sits at a bound
    _, n_l, n_a = best
    # without the staleness bound, the optimum balances r_L n_L = r_A n_A on every slot
    balanced = slots * actor_rate / (learner_rate + actor_rate)
    if balanced > cap + 1e-9:
        bound = "staleness"
    elif balanced < 1 - 1e-9:
        bound = "floor"
    else:
        bound = "balance"
    return Allocation(learners=n_l, actors=n_a, learner_rate=n_l * learner_rate,
                      actor_rate=n_a * actor_rate, lp_learners=lp_l, lp_actors=lp_a,
                      bound=bound)


def _solve(**lp):
    from scipy.optimize import linprog  # ~1 s to import: only runs that allocate pay it

    res = linprog(method="highs", **lp)
    if not res.success:  # cannot happen for valid inputs: (1, 1, 0) is always feasible
        raise RuntimeError(f"the allocation LP failed: {res.message}")
    return res


def worth_changing(current: Allocation | None, new: Allocation, *, learner_rate: float,
                   actor_rate: float, slots: int, max_learners: int | None = None,
                   gain: float = CHANGE_GAIN) -> bool:
    """Whether ``new`` should replace the running allocation ``current``: always when there is
    none or it no longer fits ``slots`` and the staleness bound; otherwise only when ``new``
    trains faster by more than ``gain`` at these per-slot rates. Measured task times are noisy,
    and near a tie the optimum would flip back and forth, each flip resizing the cluster."""
    if current is None:
        return True
    cap = learner_cap(slots, max_learners)
    if current.learners + current.actors > slots or current.learners > cap:
        return True
    running = trained_rate(current.learners, current.actors, learner_rate, actor_rate)
    return trained_rate(new.learners, new.actors, learner_rate, actor_rate) > (1 + gain) * running


def operating_rule(staleness_ratio: float) -> str | None:
    """TianJi's tuning rule for a measured staleness ratio ``P``: ``"more_learners"``,
    ``"larger_batch"`` or None (within [0.1, 0.3])."""
    if staleness_ratio > MORE_LEARNERS_ABOVE:
        return "more_learners"
    if staleness_ratio < LARGER_BATCH_BELOW:
        return "larger_batch"
    return None
