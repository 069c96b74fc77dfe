"""Aggregation strategies driven by scripted events (no cluster)."""

import numpy as np
import pytest

from dask_rl.config import AsyncConfig, SyncConfig
from dask_rl.staleness import STRATEGIES, Arrival, Decision, make_strategy

CONFIGS = {"sync": SyncConfig(), "async": AsyncConfig()}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_honours_the_interface(name):
    """Same script for all: versions only move on updates, every gradient is accounted for."""
    s = make_strategy(CONFIGS[name])
    assert s.name == name and s.version == 0
    gid = 0
    applied = dropped = 0
    for step in range(40):
        lids = [f"L{step}-{k}" for k in range(3)]
        for lid in lids:
            s.on_learner_started(lid, s.version)
        for lid in lids:
            before = s.version
            d = s.on_gradient(Arrival(gid, lid, before))
            gid += 1
            assert isinstance(d, Decision)
            assert s.version == before + (0 if d.wait else 1)
            assert all(w > 0 for _, w in d.apply)
            applied += len(d.apply)
            dropped += len(d.drop)
        d = s.on_round_end()
        applied += len(d.apply)
        dropped += len(d.drop)
    # everything that arrived was applied, dropped, or is still buffered
    assert applied + dropped + len(s.buffer) == gid
    assert s.stats.applied == applied and s.stats.dropped == dropped
    state = s.state_dict()
    t = make_strategy(CONFIGS[name])
    t.load_state_dict(state)
    assert t.version == s.version and t.stats.applied == s.stats.applied
    np.testing.assert_array_equal(t.stats.histogram, s.stats.histogram)


def test_state_of_another_strategy_is_refused():
    with pytest.raises(ValueError, match="strategy state is for 'sync', not 'async'"):
        make_strategy(AsyncConfig()).load_state_dict(make_strategy(SyncConfig()).state_dict())


def test_async_applies_on_arrival_with_staleness():
    s = make_strategy(AsyncConfig())
    s.on_learner_started("a", 0)
    s.on_learner_started("b", 0)
    assert s.on_gradient(Arrival(0, "a", 0)).apply == ((0, 1.0),)
    assert s.on_gradient(Arrival(1, "b", 0)).apply == ((1, 1.0),)  # one version stale
    assert s.version == 2
    assert s.stats.staleness_max == 1 and s.stats.staleness_mean == 0.5
    assert s.stats.histogram[:2].tolist() == [1, 1]


def test_sync_barrier_waits_for_every_active_learner():
    s = make_strategy(SyncConfig())
    for lid in "abc":
        s.on_learner_started(lid, 0)
    assert s.on_gradient(Arrival(0, "a", 0)).wait
    assert s.on_gradient(Arrival(1, "b", 0)).wait
    d = s.on_gradient(Arrival(2, "c", 0))
    assert d.apply == ((0, 1 / 3), (1, 1 / 3), (2, 1 / 3))
    assert s.version == 1 and s.stats.staleness_max == 0


def test_sync_barrier_is_released_by_a_lost_learner():
    s = make_strategy(SyncConfig())
    s.on_learner_started("a", 0)
    s.on_learner_started("b", 0)
    assert s.on_gradient(Arrival(0, "a", 0)).wait
    d = s.on_learner_lost("b")
    assert d.apply == ((0, 1.0),)
    assert s.stats.lost_learners == 1
