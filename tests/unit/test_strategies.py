"""Aggregation strategies driven by scripted events, with hand-computed decisions."""

import math

import numpy as np
import pytest

from dask_rl.staleness import (
    STRATEGIES,
    Arrival,
    AsyncConfig,
    Decision,
    SoftsyncConfig,
    SSPConfig,
    StellarisConfig,
    SyncConfig,
    make_strategy,
)
from dask_rl.staleness.stellaris import step_scale

CONFIGS = {"sync": SyncConfig(), "async": AsyncConfig(), "ssp": SSPConfig(bound=2),
           "softsync": SoftsyncConfig(n=2), "stellaris": StellarisConfig()}


def test_configs_cover_every_strategy():
    assert set(CONFIGS) == set(STRATEGIES)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_honours_the_interface(name):
    """One random script for all: learners start, push, get lost; rounds end."""
    rng = np.random.default_rng(0)
    s = make_strategy(CONFIGS[name], learners=4)
    assert s.name == name and s.version == 0
    active: dict[str, int] = {}
    applied_ids: list[int] = []
    dropped_ids: list[int] = []
    gid = 0
    for step in range(400):
        event = rng.choice(["start", "push", "lost", "round"], p=[0.4, 0.45, 0.05, 0.1])
        decisions: list[Decision] = []
        if event == "start" and len(active) < 4:
            lid = f"L{step}"
            active[lid] = s.version
            s.on_learner_started(lid, s.version)
        elif event in ("push", "lost") and active:
            lid = sorted(active)[rng.integers(len(active))]
            pulled = active.pop(lid)
            if event == "push":
                before = s.version
                decisions = s.on_gradient(Arrival(gid, lid, pulled))
                gid += 1
            else:
                before = s.version
                decisions = s.on_learner_lost(lid)
            assert s.version == before + sum(not d.wait for d in decisions)
        elif event == "round":
            decisions = s.on_round_end(reward=float(step))
        for d in decisions:
            assert isinstance(d, Decision)
            assert all(w > 0 for _, w in d.apply)
            applied_ids += d.ids
            dropped_ids += d.drop
    assert len(set(applied_ids)) == len(applied_ids), "a gradient was applied twice"
    assert not set(applied_ids) & set(dropped_ids)
    assert len(applied_ids) + len(dropped_ids) + len(s.buffer) == gid
    assert s.stats.applied == len(applied_ids) and s.stats.dropped == len(dropped_ids)
    assert s.stats.updates == s.version > 0
    assert s.stats.histogram.sum() == s.stats.applied
    t = make_strategy(CONFIGS[name], learners=4)
    t.load_state_dict(s.state_dict())
    assert t.version == s.version and t.stats.applied == s.stats.applied
    assert t.metrics()["staleness/mean"] == s.metrics()["staleness/mean"]


def test_state_of_another_strategy_is_refused():
    with pytest.raises(ValueError, match="strategy state is for 'sync', not 'async'"):
        make_strategy(AsyncConfig()).load_state_dict(make_strategy(SyncConfig()).state_dict())


# ---- async ---------------------------------------------------------------------------------

def test_async_applies_on_arrival_with_staleness():
    s = make_strategy(AsyncConfig())
    s.on_learner_started("a", 0)
    s.on_learner_started("b", 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == [Decision(apply=((0, 1.0),))]
    assert s.on_gradient(Arrival(1, "b", 0)) == [Decision(apply=((1, 1.0),))]  # 1 stale
    assert s.version == 2
    assert s.stats.staleness_max == 1 and s.stats.staleness_mean == 0.5
    assert s.stats.histogram[:2].tolist() == [1, 1]


# ---- sync ----------------------------------------------------------------------------------

def test_sync_barrier_waits_for_every_active_learner():
    s = make_strategy(SyncConfig())
    for lid in "abc":
        s.on_learner_started(lid, 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == []
    assert s.on_gradient(Arrival(1, "b", 0)) == []
    [d] = s.on_gradient(Arrival(2, "c", 0))
    assert d.apply == ((0, 1 / 3), (1, 1 / 3), (2, 1 / 3))
    assert s.version == 1 and s.stats.staleness_max == 0


def test_sync_barrier_is_released_by_a_lost_learner():
    s = make_strategy(SyncConfig())
    s.on_learner_started("a", 0)
    s.on_learner_started("b", 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == []
    [d] = s.on_learner_lost("b")
    assert d.apply == ((0, 1.0),)
    assert s.stats.lost_learners == 1


# ---- SSP -----------------------------------------------------------------------------------

def test_ssp_fast_gradients_wait_for_the_slow_learner():
    s = make_strategy(SSPConfig(bound=1))
    for lid in "abc":
        s.on_learner_started(lid, 0)
    # a: v0 -> 1, and b, c (pulled v0) are 1 behind: within the bound
    assert s.on_gradient(Arrival(0, "a", 0)) == [Decision(apply=((0, 1.0),))]
    # b arrives 1 stale; applying it would put c 2 behind: it waits
    assert s.on_gradient(Arrival(1, "b", 0)) == []
    s.on_learner_started("d", 1)
    # c arrives 1 stale; d (pulled v1) would stay within 1: b and c go in one update
    [d] = s.on_gradient(Arrival(2, "c", 0))
    assert d.apply == ((1, 0.5), (2, 0.5))
    assert s.version == 2 and s.stats.staleness_max == 1


def test_ssp_bound_zero_is_a_barrier_and_stale_gradients_are_dropped():
    s = make_strategy(SSPConfig(bound=0))
    s.on_learner_started("a", 0)
    s.on_learner_started("b", 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == []
    [d] = s.on_gradient(Arrival(1, "b", 0))
    assert d.apply == ((0, 0.5), (1, 0.5))
    # a gradient from before a restore is staler than the bound: dropped, counted
    s.on_learner_started("c", 1)
    assert s.on_gradient(Arrival(2, "old", 0)) == [Decision(drop=(2,))]
    assert s.on_gradient(Arrival(3, "c", 1)) == [Decision(apply=((3, 1.0),))]
    assert s.stats.dropped == 1


# ---- n-softsync ----------------------------------------------------------------------------

def test_softsync_groups_and_scales_by_mean_staleness():
    s = make_strategy(SoftsyncConfig(n=2), learners=4)  # groups of floor(4 / 2) = 2
    assert s.group == 2
    assert s.on_gradient(Arrival(0, "a", 0)) == []
    [d] = s.on_gradient(Arrival(1, "b", 0))
    assert d.apply == ((0, 0.5), (1, 0.5))  # <tau> = 0 counts as 1
    assert s.on_gradient(Arrival(2, "c", 0)) == []  # 1 stale
    [d] = s.on_gradient(Arrival(3, "d", 0))
    assert d.apply == ((2, 0.5), (3, 0.5))  # <tau> = 1
    assert s.version == 2
    s.on_gradient(Arrival(4, "e", 0))  # 2 stale
    [d] = s.on_gradient(Arrival(5, "f", 0))  # 2 stale: <tau> = 2, alpha0 / 2, averaged
    assert d.apply == ((4, 0.25), (5, 0.25))
    assert s.last_update["lr_scale"] == 0.5


def test_softsync_n_equal_learners_is_async_with_scaled_steps():
    s = make_strategy(SoftsyncConfig(n=4), learners=4)
    assert s.group == 1
    [d] = s.on_gradient(Arrival(0, "a", 0))
    assert d.apply == ((0, 1.0),)
    [d] = s.on_gradient(Arrival(1, "b", 0))
    assert d.apply == ((1, 1.0),)  # staleness 1 -> alpha0 / 1
    s.on_gradient(Arrival(2, "c", 0))  # staleness 2
    assert s.last_update["lr_scale"] == 0.5


# ---- Stellaris -----------------------------------------------------------------------------

def test_stellaris_step_scale():
    assert step_scale(0, 3) == 1.0
    assert step_scale(1, 3) == 1.0
    assert step_scale(8, 3) == pytest.approx(0.5)
    assert step_scale(27, 3) == pytest.approx(1 / 3)
    assert step_scale(4, 2) == pytest.approx(0.5)


def test_stellaris_is_async_until_a_stale_round_then_the_threshold_decays():
    s = make_strategy(StellarisConfig(decay=0.5), learners=4)
    assert math.isinf(s.threshold)
    s.on_learner_started("a", 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == [Decision(apply=((0, 1.0),))]
    s.on_round_end()  # nothing was stale: still no threshold
    assert math.isinf(s.threshold) and s.delta_max is None
    for lid in "bcd":
        s.on_learner_started(lid, 1)
    s.on_gradient(Arrival(1, "b", 1))         # fresh: applied at once (beta infinite)
    s.on_gradient(Arrival(2, "c", 1))         # staleness 1
    s.on_gradient(Arrival(3, "d", 1))         # staleness 2
    s.on_round_end()                          # first stale round: delta_max = 2, beta_0 = 2
    assert s.delta_max == 2 and s.threshold == 2
    s.on_round_end()
    assert s.threshold == 1.0                 # beta_1 = 2 * 0.5
    s.on_round_end()
    assert s.threshold == 0.5


def test_stellaris_gate_waits_for_fresher_gradients_and_scales_steps():
    s = make_strategy(StellarisConfig(decay=1.0, smoothness=3), learners=4)
    s.delta_max, s.beta = 4.0, 4.0
    s.version = 10
    for lid, v in (("a", 2), ("b", 10), ("c", 10)):
        s.on_learner_started(lid, v)
    # a: staleness 8 >= beta 4, learners b and c still computing: wait
    assert s.on_gradient(Arrival(0, "a", 2)) == []
    # b: fresh, buffer mean (8 + 0) / 2 = 4, still not < 4: wait
    assert s.on_gradient(Arrival(1, "b", 10)) == []
    # c: fresh, mean 8 / 3 < 4: aggregate, g = (1/3)(8^(-1/3) g_a + g_b + g_c)
    [d] = s.on_gradient(Arrival(2, "c", 10))
    weights = dict(d.apply)
    assert weights[0] == pytest.approx(0.5 / 3)
    assert weights[1] == pytest.approx(1 / 3) and weights[2] == pytest.approx(1 / 3)
    assert s.version == 11


def test_stellaris_never_waits_when_no_fresher_gradient_can_come():
    s = make_strategy(StellarisConfig(), learners=4)
    s.delta_max, s.beta, s.version = 4.0, 0.5, 6
    s.on_learner_started("a", 0)
    [d] = s.on_gradient(Arrival(0, "a", 0))   # staleness 6 >= beta but nobody is computing
    assert d.apply == ((0, pytest.approx(6 ** (-1 / 3))),)
    # with a full buffer (one gradient per allowed learner) it aggregates too
    s2 = make_strategy(StellarisConfig(), learners=2)
    s2.delta_max, s2.beta, s2.version = 4.0, 0.5, 6
    for lid in "abc":
        s2.on_learner_started(lid, 0)
    assert s2.on_gradient(Arrival(0, "a", 0)) == []
    [d] = s2.on_gradient(Arrival(1, "b", 0))
    assert d.ids == (0, 1)


def test_stellaris_auto_decay_follows_reward_progress():
    s = make_strategy(StellarisConfig(decay="auto"), learners=4)
    s.delta_max, s.beta = 4.0, 4.0
    assert s.decay == 0.96
    s.on_round_end(reward=10.0)               # first signal: no change
    assert s.decay == 0.96 and s.threshold == pytest.approx(4 * 0.96)
    s.on_round_end(reward=20.0)               # improving: towards 0.999
    assert s.decay == pytest.approx(0.96 + 0.25 * (0.999 - 0.96))
    d = s.decay
    s.on_round_end(reward=5.0)                # worse: towards 0.90
    assert s.decay == pytest.approx(d + 0.25 * (0.90 - d))
    s.on_round_end()                          # no signal: unchanged
    assert s.decay == pytest.approx(d + 0.25 * (0.90 - d))
