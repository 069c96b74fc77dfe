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
    TianjiConfig,
    make_strategy,
)
from dask_rl.staleness.stellaris import step_scale

CONFIGS = {"sync": SyncConfig(), "async": AsyncConfig(), "ssp": SSPConfig(bound=2),
           "softsync": SoftsyncConfig(n=2), "stellaris": StellarisConfig(),
           "tianji": TianjiConfig()}


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

def test_ssp_gates_reads_not_updates():
    """Ho et al. 2013: a learner may start only within s clocks of the slowest; every update
    is applied on arrival, on its own, weight 1."""
    s = make_strategy(SSPConfig(bound=1))
    for lid in "abc":
        assert s.admit(lid)
        s.on_learner_started(lid, 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == [Decision(apply=((0, 1.0),))]
    # version 1; the slowest computing learner holds v0: a new reader is 1 ahead, within s
    assert s.admit("d")
    s.on_learner_started("d", 1)
    assert s.on_gradient(Arrival(1, "b", 0)) == [Decision(apply=((1, 1.0),))]
    # version 2, c still holds v0: a reader would be 2 ahead > s: it waits
    assert not s.admit("e")
    assert s.on_gradient(Arrival(2, "c", 0)) == [Decision(apply=((2, 1.0),))]
    # c pushed: the slowest is d at v1, version 3: gap 2 > 1, still waits
    assert not s.admit("e")
    assert s.on_gradient(Arrival(3, "d", 1)) == [Decision(apply=((3, 1.0),))]
    assert s.admit("e")                       # nobody computing: no gap
    m = s.metrics()
    assert m["ssp/max_read_gap"] == 1 and m["ssp/refused_reads"] == 2
    # c's gradient arrived 2 stale: SSP bounds the clock gap, not each gradient's staleness
    assert s.stats.staleness_max == 2


def test_ssp_counts_clocks_in_rounds_of_its_learners():
    """With P = 4 learners a clock is 4 updates: s = 1 lets a reader be 4 versions ahead."""
    s = make_strategy(SSPConfig(bound=1), learners=4)
    s.on_learner_started("slow", 0)
    for i in range(4):
        s.on_learner_started(f"f{i}", s.version)
        s.on_gradient(Arrival(i, f"f{i}", s.version))
    assert s.version == 4 and s.admit("x")      # gap 4 = 1 clock
    s.on_learner_started("f4", 4)
    s.on_gradient(Arrival(4, "f4", 4))
    assert not s.admit("y")                     # gap 5 > 4


def test_ssp_bound_zero_admits_only_readers_of_the_current_version():
    s = make_strategy(SSPConfig(bound=0))
    s.on_learner_started("a", 0)
    s.on_learner_started("b", 0)
    assert s.admit("c")                        # same version as everyone: gap 0
    s.on_gradient(Arrival(0, "a", 0))          # applied at once: version 1
    assert not s.admit("c")                    # b still computes on v0
    assert s.on_learner_lost("b") == []        # a lost learner frees the gate
    assert s.admit("c")


# ---- sync and replaced parameters ----------------------------------------------------------

def test_sync_barrier_waits_for_learners_announced_but_not_started():
    """The round's learners are known when its rollouts start: a gradient cannot be applied
    before a learner whose trajectory is not collected yet has pushed."""
    s = make_strategy(SyncConfig())
    for lid in ("r0", "r1", "r2"):
        s.on_learner_expected(lid)
    s.on_learner_started("r0", 0)
    assert s.on_gradient(Arrival(0, "r0", 0)) == []     # r1, r2 not even launched: wait
    s.on_learner_started("r1", 0)
    assert s.on_gradient(Arrival(1, "r1", 0)) == []
    assert s.on_learner_lost("r2") == [Decision(apply=((0, 0.5), (1, 0.5)))]
    assert s.stats.staleness_max == 0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gradients_on_replaced_parameters_are_dropped_and_counted(name):
    """PBT's exploit replaces the weights: learners still computing learned from the old ones."""
    s = make_strategy(CONFIGS[name], learners=1)
    s.on_learner_started("old", 0)
    s.on_replaced()
    s.on_learner_started("new", s.version)
    decisions = s.on_gradient(Arrival(0, "old", 0))
    assert [d.drop for d in decisions if d.drop] == [(0,)]
    assert s.stats.superseded == 1 and s.metrics()["gradients/superseded"] == 1
    assert not any(0 in d.ids for d in decisions)
    decisions = s.on_gradient(Arrival(1, "new", s.version))
    assert any(1 in d.ids for d in decisions)


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


def test_softsync_scales_a_group_by_its_mean_staleness_not_per_gradient():
    s = make_strategy(SoftsyncConfig(n=2), learners=4)
    s.version = 3
    assert s.on_gradient(Arrival(0, "a", 2)) == []       # tau 1
    [d] = s.on_gradient(Arrival(1, "b", 0))              # tau 3: <tau> = 2
    assert d.apply == ((0, 0.25), (1, 0.25))             # per gradient would be 1/2 and 1/6


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


def test_stellaris_is_async_until_a_stale_round_then_the_threshold_decays_to_its_floor():
    s = make_strategy(StellarisConfig(decay=0.5, threshold_floor=0.7), learners=4)
    assert math.isinf(s.beta)
    s.on_learner_started("a", 0)
    assert s.on_gradient(Arrival(0, "a", 0)) == [Decision(apply=((0, 1.0),))]
    s.on_round_end()  # nothing was stale: still no threshold
    assert math.isinf(s.beta) and s.delta_max is None
    for lid in "bcd":
        s.on_learner_started(lid, 1)
    s.on_gradient(Arrival(1, "b", 1))         # fresh: applied at once (beta infinite)
    s.on_gradient(Arrival(2, "c", 1))         # staleness 1
    s.on_gradient(Arrival(3, "d", 1))         # staleness 2
    s.on_round_end()                          # first stale round: delta_max = 2, beta_0 = 2
    assert s.delta_max == 2 and s.beta == 2
    want = [max(2 * 0.5 ** k, 0.7) for k in range(1, 6)]  # beta_k = max(delta_max d^k, floor)
    got = []
    for _ in range(5):
        s.on_round_end()
        got.append(s.beta)
    assert got == pytest.approx(want)


def test_stellaris_delta_max_is_the_largest_staleness_of_the_first_stale_round():
    """Staleness 0, 0, 0, 3: the paper's delta_max is 3 (the released code's int(mean) + 1
    would be 1)."""
    s = make_strategy(StellarisConfig(), learners=4)
    s.on_learner_started("d", 0)
    for i, lid in enumerate("abc"):
        s.on_learner_started(lid, s.version)
        s.on_gradient(Arrival(i, lid, s.version))   # fresh, applied at once
    s.on_gradient(Arrival(3, "d", 0))               # 3 stale
    s.on_round_end()
    assert s.delta_max == 3 and s.beta == 3


def test_stellaris_default_floor_stops_the_decay_at_one():
    """After 40 rounds beta is 2 * 0.96^40 = 0.39 without a floor: a 1-stale gradient, and
    then a fresh one beside it (mean 0.5), wait for more. With the default floor (1) the
    1-stale gradient is applied at once."""
    for floor in (1.0, 0.0):
        s = make_strategy(StellarisConfig(threshold_floor=floor), learners=4)
        s.delta_max, s.decayed, s.version = 2.0, 2.0 * 0.96 ** 40, 5
        for lid, v in (("a", 4), ("b", 5), ("c", 5)):
            s.on_learner_started(lid, v)
        decisions = s.on_gradient(Arrival(0, "a", 4))    # mean 1
        if floor:
            assert decisions and s.released["below"] == 1
            continue
        assert decisions == []
        assert s.on_gradient(Arrival(1, "b", 5)) == []   # mean 0.5 >= beta 0.39: waits
    assert StellarisConfig().threshold_floor == 1.0


@pytest.mark.parametrize("lags, applied", [((1,), True), ((2,), False), ((2, 1), False),
                                           ((2, 0), True)])
def test_stellaris_floor_is_the_released_codes_lowest_bound(lags, applied):
    """The released code aggregates when the buffer's mean staleness is <= its bound, and its
    bound is never below 1: at the floor a buffer of mean exactly 1 is applied (the paper's
    strict delta < beta_k alone would hold it), one of mean 1.5 waits."""
    s = make_strategy(StellarisConfig(), learners=4)
    s.delta_max, s.decayed, s.version = 2.0, 2.0 * 0.96 ** 40, 5   # beta at the floor, 1
    for lid in "cd":            # still computing: the buffer is neither idle nor full
        s.on_learner_started(lid, 5)
    decisions = []
    for i, lag in enumerate(lags):
        s.on_learner_started(f"L{i}", 5 - lag)
        decisions = s.on_gradient(Arrival(i, f"L{i}", 5 - lag))
        if i < len(lags) - 1:
            assert decisions == []   # a lone gradient staler than the floor waits
    assert bool(decisions) is applied
    assert s.released["below"] == int(applied)


def test_stellaris_gate_waits_for_fresher_gradients_and_scales_steps():
    s = make_strategy(StellarisConfig(decay=1.0, smoothness=3), learners=4)
    s.delta_max, s.decayed = 4.0, 4.0
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
    m = s.metrics()
    assert m["threshold/waits"] == 2 and m["threshold/released_below"] == 1


def test_stellaris_never_waits_when_no_fresher_gradient_can_come():
    s = make_strategy(StellarisConfig(threshold_floor=0.5), learners=4)
    s.delta_max, s.decayed, s.version = 4.0, 0.5, 6
    s.on_learner_started("a", 0)
    [d] = s.on_gradient(Arrival(0, "a", 0))   # staleness 6 >= beta but nobody is computing
    assert d.apply == ((0, pytest.approx(6 ** (-1 / 3))),)
    assert s.released["idle"] == 1
    # with a full buffer (one gradient per allowed learner) it aggregates too
    s2 = make_strategy(StellarisConfig(threshold_floor=0.5), learners=2)
    s2.delta_max, s2.decayed, s2.version = 4.0, 0.5, 6
    for lid in "abc":
        s2.on_learner_started(lid, 0)
    assert s2.on_gradient(Arrival(0, "a", 0)) == []
    [d] = s2.on_gradient(Arrival(1, "b", 0))
    assert d.ids == (0, 1) and s2.released["full"] == 1


def _stellaris_reference(events, *, learners, decay, smoothness, floor):
    """Stellaris' server from the paper, event by event, in plain loops: the threshold
    beta_k = delta_max * d^k (delta_max: the largest staleness of the first round with a
    stale gradient; k: rounds since), never below the floor; a buffer is aggregated when its
    mean staleness delta is below beta_k (or at most the floor), or when no learner is
    computing, or when it holds one gradient per learner; g_c = (1/H_c) sum_j
    delta_j^(-1/v) g_j (alpha0 applied by the actor; delta_j = 0 counts 1). Returns every
    update as [(gradient id, weight), ...]."""
    version, buffer, computing = 0, [], {}
    delta_max, k, round_max = None, 0, 0
    updates = []

    def gate():
        nonlocal version, buffer
        if not buffer:
            return
        ages = [version - pulled for _, pulled in buffer]
        mean = sum(ages) / len(ages)
        beta = math.inf if delta_max is None else max(delta_max * decay ** k, floor)
        if mean < beta or mean <= floor or not computing or len(buffer) >= learners:
            h = len(buffer)
            updates.append([(gid, (1.0 if age == 0 else age ** (-1.0 / smoothness)) / h)
                            for (gid, _), age in zip(buffer, ages)])
            version += 1
            buffer = []

    for event in events:
        if event[0] == "start":
            computing[event[1]] = version
        elif event[0] == "push":
            pulled = computing.pop(event[1])
            round_max = max(round_max, version - pulled)
            buffer.append((event[2], pulled))
            gate()
        else:   # the end of a round
            if delta_max is None:
                if round_max > 0:
                    delta_max, k = round_max, 0
            else:
                k += 1
            round_max = 0
            gate()
    return updates


@pytest.mark.parametrize("seed", range(8))
def test_stellaris_matches_the_papers_server_on_random_event_streams(seed):
    """Random starts, pushes and round ends (up to 6 learners computing, 4 allowed to fill
    the buffer), random d, v and floor: every update's gradients and weights are the
    reference's."""
    rng = np.random.default_rng(seed)
    learners = 4
    cfg = dict(decay=float(rng.uniform(0.5, 1.0)), smoothness=float(rng.choice([1, 2, 3])),
               floor=float(rng.choice([0.0, 1.0, 1.5])))
    s = make_strategy(StellarisConfig(decay=cfg["decay"], smoothness=cfg["smoothness"],
                                      threshold_floor=cfg["floor"]), learners=learners)
    events, computing, pulled, gid, got = [], [], {}, 0, []
    for step in range(400):
        r = rng.random()
        if computing and (r < 0.45 or len(computing) >= 6):
            lid = computing.pop(int(rng.integers(len(computing))))
            events.append(("push", lid, gid))
            got += [list(d.apply) for d in s.on_gradient(Arrival(gid, lid, pulled[lid]))
                    if d.apply]
            gid += 1
        elif r < 0.9:
            lid = f"L{step}"
            computing.append(lid)
            pulled[lid] = s.version
            events.append(("start", lid))
            s.on_learner_started(lid, s.version)
        else:
            events.append(("round",))
            got += [list(d.apply) for d in s.on_round_end() if d.apply]
    want = _stellaris_reference(events, learners=learners, **cfg)
    assert len(want) > 50 and any(len(u) > 1 for u in want)   # the gate did hold some back
    assert [[i for i, _ in u] for u in got] == [[i for i, _ in u] for u in want]
    for u, w in zip(got, want):
        assert [x for _, x in u] == pytest.approx([x for _, x in w])


def test_stellaris_auto_decay_follows_reward_progress():
    s = make_strategy(StellarisConfig(decay="auto"), learners=4)
    s.delta_max, s.decayed = 4.0, 4.0
    assert s.decay == 0.96
    s.on_round_end(reward=10.0)               # first signal: no change
    assert s.decay == 0.96 and s.beta == pytest.approx(4 * 0.96)
    s.on_round_end(reward=20.0)               # improving: towards 0.999
    assert s.decay == pytest.approx(0.96 + 0.25 * (0.999 - 0.96))
    d = s.decay
    s.on_round_end(reward=5.0)                # worse: towards 0.90
    assert s.decay == pytest.approx(d + 0.25 * (0.90 - d))
    s.on_round_end()                          # no signal: unchanged
    assert s.decay == pytest.approx(d + 0.25 * (0.90 - d))


# ---- TianJi ---------------------------------------------------------------------------------

def test_tianji_step_follows_the_share_of_stale_samples_by_hand():
    """alpha_eff / alpha = 1 / (1 + lambda P), P over the last `window` gradients' samples;
    a gradient's samples are stale when their policy lags by more than `lag_tolerance`."""
    s = make_strategy(TianjiConfig(lam=2.0, window=2, lag_tolerance=1), learners=4)
    for lid in "abcde":
        s.on_learner_started(lid, 0)
    [d] = s.on_gradient(Arrival(0, "a", 0, samples=100, sample_lag=1))  # fresh: P = 0
    assert d.apply == ((0, 1.0),)
    [d] = s.on_gradient(Arrival(1, "b", 0, samples=100, sample_lag=2))  # P = 100/200
    assert d.apply == ((1, pytest.approx(1 / 2)),)
    [d] = s.on_gradient(Arrival(2, "c", 0, samples=50, sample_lag=5))   # P = 150/150
    assert d.apply == ((2, pytest.approx(1 / 3)),)
    [d] = s.on_gradient(Arrival(3, "d", 0))                              # unreported
    assert d.apply == ((3, pytest.approx(1 / 3)),) and s.ratio == 1.0
    [d] = s.on_gradient(Arrival(4, "e", 0, samples=150, sample_lag=0))  # P = 50/200
    assert d.apply == ((4, pytest.approx(1 / 1.5)),)
    assert s.metrics()["tianji/P"] == pytest.approx(0.25)
    assert s.last_update["lr_scale"] == pytest.approx(1 / 1.5)
    assert s.stats.staleness_sum == 0 + 1 + 2 + 3 + 4  # applied on arrival: never waits


@pytest.mark.parametrize("tolerance", [0, 1, 3])
def test_tianji_lag_tolerance_separates_fresh_from_stale(tolerance):
    """A lag equal to the tolerance is fresh, one more is stale; tolerance 0 is the strict
    rule (any lag at all is stale)."""
    fresh = make_strategy(TianjiConfig(lag_tolerance=tolerance), learners=1)
    fresh.on_learner_started("a", 0)
    fresh.on_gradient(Arrival(0, "a", 0, samples=10, sample_lag=tolerance))
    stale = make_strategy(TianjiConfig(lag_tolerance=tolerance), learners=1)
    stale.on_learner_started("a", 0)
    stale.on_gradient(Arrival(0, "a", 0, samples=10, sample_lag=tolerance + 1))
    assert (fresh.ratio, stale.ratio) == (0.0, 1.0)


def test_tianji_against_per_sample_reference():
    """Random pushes; the reference flags every sample by its own policy's lag."""
    rng = np.random.default_rng(3)
    lam, window, tolerance = 0.7, 5, 2
    s = make_strategy(TianjiConfig(lam=lam, window=window, lag_tolerance=tolerance),
                      learners=8)
    flags: list[list[bool]] = []  # one list of per-sample flags per reporting gradient
    for gid in range(200):
        s.on_learner_started(f"L{gid}", s.version)
        n = int(rng.integers(0, 40))
        lag = int(rng.integers(0, 6))
        [d] = s.on_gradient(Arrival(gid, f"L{gid}", s.version, samples=n, sample_lag=lag))
        if n:
            flags.append([lag > tolerance for _ in range(n)])
        recent = [f for g in flags[-window:] for f in g]
        p = sum(recent) / len(recent) if recent else 0.0
        assert d.apply == ((gid, pytest.approx(1.0 / (1.0 + lam * p))),)


def test_tianji_state_keeps_its_window():
    s = make_strategy(TianjiConfig(window=3), learners=2)
    s.on_learner_started("a", 0)
    s.on_gradient(Arrival(0, "a", 0, samples=10, sample_lag=0))
    s.on_learner_started("b", 0)
    s.on_gradient(Arrival(1, "b", 0, samples=30, sample_lag=2))
    t = make_strategy(TianjiConfig(window=3), learners=2)
    t.load_state_dict(s.state_dict())
    assert t.ratio == pytest.approx(0.75)
    t.on_learner_started("c", 2)
    [d] = t.on_gradient(Arrival(2, "c", 2, samples=40, sample_lag=0))
    assert d.apply == ((2, pytest.approx(1 / (1 + 30 / 80))),)


def test_tianji_ignores_superseded_gradients_in_its_ratio():
    s = make_strategy(TianjiConfig(), learners=2)
    s.on_learner_started("a", 0)
    s.on_replaced()
    [d] = s.on_gradient(Arrival(0, "a", 0, samples=10, sample_lag=10))
    assert d.drop == (0,) and s.ratio == 0.0
