"""TianJi's allocation LP on scripted throughputs whose optimum is known."""

import itertools

import numpy as np
import pytest

from dask_rl.control.allocation import balance, operating_rule


def _best_by_enumeration(r_l, r_a, slots, cap):
    """Every integer allocation tried: the max of min(T_RL, T_RA), fewest slots on ties."""
    best = None
    for n_l, n_a in itertools.product(range(1, cap + 1), range(1, slots)):
        if n_l + n_a > slots:
            continue
        score = (min(n_l * r_l, n_a * r_a), -(n_l + n_a))
        if best is None or score > best[0]:
            best = (score, (n_l, n_a))
    return best


def test_balanced_rates_on_an_exact_split():
    # T_RL = 100 n_L, T_RA = 300 n_A, 8 slots: 100 n_L = 300 n_A and n_L + n_A = 8 -> 6 / 2
    a = balance(learner_rate=100, actor_rate=300, slots=8)
    assert (a.learners, a.actors) == (6, 2)
    assert a.lp_learners == pytest.approx(6) and a.lp_actors == pytest.approx(2)
    assert a.throughput == 600 and a.bound == "balance"


def test_a_fractional_optimum_rounds_to_the_best_integer_allocation():
    # 100 n_L = 200 n_A, n_L + n_A = 8: LP 16/3 and 8/3; integers: (5, 3) gives min(500, 600)
    a = balance(learner_rate=100, actor_rate=200, slots=8)
    assert a.lp_learners == pytest.approx(16 / 3) and a.lp_actors == pytest.approx(8 / 3)
    assert (a.learners, a.actors) == (5, 3) and a.throughput == 500


def test_the_staleness_bound_caps_learners_and_actors_are_not_wasted():
    # 3 learners at most: T_RL = 300, one actor slot already produces 300
    a = balance(learner_rate=100, actor_rate=300, slots=8, max_learners=3)
    assert (a.learners, a.actors) == (3, 1) and a.throughput == 300
    assert a.bound == "staleness"


@pytest.mark.parametrize("seed", range(40))
def test_matches_enumeration_on_random_rates(seed):
    rng = np.random.default_rng(seed)
    r_l, r_a = rng.uniform(10, 1000, 2)
    slots = int(rng.integers(2, 33))
    cap = int(rng.integers(1, slots))
    a = balance(learner_rate=r_l, actor_rate=r_a, slots=slots, max_learners=cap)
    (score, _), (n_l, n_a) = _best_by_enumeration(r_l, r_a, slots, cap)
    assert a.throughput == pytest.approx(score)
    assert a.learners <= cap and a.learners + a.actors <= slots
    assert a.learners + a.actors == n_l + n_a  # ties go to the fewest slots


def test_a_capped_learner_at_task_rates_gets_only_the_actors_it_needs():
    # rates in trajectories/s (1 / task seconds), as the scaler passes them: one learner
    # absorbs 1.904/s, two actors already make 3.5/s; the other 18 slots would only queue
    a = balance(learner_rate=1.904, actor_rate=1.763, slots=21, max_learners=1)
    assert (a.learners, a.actors) == (1, 2) and a.bound == "staleness"


@pytest.mark.parametrize("seed", range(40))
def test_matches_enumeration_at_task_rates_with_one_learner(seed):
    rng = np.random.default_rng(1000 + seed)
    r_l, r_a = rng.uniform(0.05, 20, 2)
    slots = int(rng.integers(2, 33))
    cap = int(rng.integers(1, min(3, slots)))
    a = balance(learner_rate=r_l, actor_rate=r_a, slots=slots, max_learners=cap)
    (score, _), (n_l, n_a) = _best_by_enumeration(r_l, r_a, slots, cap)
    assert a.throughput == pytest.approx(score)
    assert a.learners + a.actors == n_l + n_a


def test_bad_rates_or_too_few_slots_are_refused():
    with pytest.raises(ValueError, match="rates"):
        balance(learner_rate=0, actor_rate=1, slots=4)
    with pytest.raises(ValueError, match="2 slots"):
        balance(learner_rate=1, actor_rate=1, slots=1)


def test_the_operating_rules_of_the_tuning_guide():
    assert operating_rule(0.35) == "more_learners"
    assert operating_rule(0.05) == "larger_batch"
    assert operating_rule(0.2) is None and operating_rule(0.3) is None


def test_one_learner_faster_than_every_actor_is_the_floor_not_a_balance():
    # a learner absorbs 100 trajectories/s, an actor makes 1/s: the balanced split would give
    # learners 4 / 101 of a slot, under the one every run needs; 1 learner, 3 actors
    a = balance(learner_rate=100.0, actor_rate=1.0, slots=4)
    assert (a.learners, a.actors, a.bound) == (1, 3, "floor")
    assert a.throughput == 3.0


def test_a_running_allocation_changes_only_for_a_clear_gain_or_when_it_no_longer_fits():
    from dask_rl.control.allocation import Allocation, worth_changing

    def alloc(n_l, n_a):
        return Allocation(learners=n_l, actors=n_a, learner_rate=0.0, actor_rate=0.0,
                          lp_learners=n_l, lp_actors=n_a, bound="balance")

    # per-slot rates: a learner 10/s, an actor 5/s; 2 + 2 trains at min(20, 10) = 10/s
    rates = {"learner_rate": 10.0, "actor_rate": 5.0, "slots": 4, "max_learners": 2}
    assert worth_changing(None, alloc(2, 2), **rates)
    # 1 + 3: min(10, 15) = 10/s, no faster: the running one stays
    assert not worth_changing(alloc(2, 2), alloc(1, 3), **rates)
    # at learner 10.5/s, actor 5/s: 1 + 3 gives 10.5 against 10, 5% faster: stays
    assert not worth_changing(alloc(2, 2), alloc(1, 3), **{**rates, "learner_rate": 10.5})
    # at learner 12/s: 12 against 10, 20% faster: changes
    assert worth_changing(alloc(2, 2), alloc(1, 3), **{**rates, "learner_rate": 12.0})
    # the cluster shrank to 3 slots: 2 + 2 no longer fits, whatever the gain
    assert worth_changing(alloc(2, 2), alloc(1, 2), **{**rates, "slots": 3})
    # the staleness bound fell to 1 learner
    assert worth_changing(alloc(2, 2), alloc(1, 3), **{**rates, "max_learners": 1})
