"""TianJi's transition replay and sample-staleness control, on scripted events."""

import numpy as np
import pytest

from dask_rl.control.replay import SampleStaleness, TransitionReplay


def test_the_buffer_keeps_the_newest_transitions_within_its_capacity():
    b = TransitionReplay(capacity=1000)
    assert b.add("a", steps=100, envs=4) == []
    assert b.add("b", steps=100, envs=4) == []
    assert b.add("c", steps=100, envs=4) == ["a"]          # 1200 > 1000: the oldest goes
    assert b.size == 800 and [h for h, _, _ in b.items()] == ["b", "c"]
    b.capacity = 2000                                      # grown: nothing more is evicted
    assert b.add("d", steps=100, envs=4) == [] and b.size == 1200


def test_sampling_is_uniform_over_transitions_not_trajectories():
    b = TransitionReplay(capacity=10_000)
    b.add("small", steps=10, envs=1)       # 10 transitions
    b.add("large", steps=30, envs=3)       # 90 transitions
    plan = b.sample(100_000, np.random.default_rng(0))
    counts = {h: len(t) for h, (t, _) in plan.items()}
    assert abs(counts["small"] / 100_000 - 0.1) < 0.005
    t, i = plan["large"]
    assert t.min() == 0 and t.max() == 29 and i.min() == 0 and i.max() == 2
    # every transition of the large trajectory is drawn about equally often
    hits = np.bincount(t * 3 + i, minlength=90)
    assert hits.min() > 0.8 * hits.mean() and hits.max() < 1.2 * hits.mean()


def test_an_empty_buffer_cannot_be_sampled():
    with pytest.raises(ValueError, match="empty"):
        TransitionReplay(capacity=10).sample(1, np.random.default_rng(0))


def test_p_above_the_tolerance_grows_the_buffer_first():
    c = SampleStaleness(batch=128, capacity=256, tolerance=0.2, max_capacity=10_000,
                        min_batch=16, lam=1.0)
    assert c.ratio(256) == 0.5
    assert c.control(256) == "grow_buffer" and c.capacity == 640   # 128 / 0.2
    assert c.control(400) is None            # still filling: P falls as it fills
    assert c.ratio(640) == pytest.approx(0.2) and c.control(640) is None
    # TianJi's learning rate: alpha / (1 + lambda P)
    assert c.learning_rate(1e-3, 256) == pytest.approx(1e-3 / 1.5)


def test_at_the_memory_cap_the_batch_shrinks():
    c = SampleStaleness(batch=128, capacity=256, tolerance=0.2, max_capacity=300,
                        min_batch=16, lam=2.0)
    assert c.control(256) == "grow_buffer" and c.capacity == 300
    assert c.control(300) == "shrink_batch" and c.batch == 60      # floor(0.2 x 300)
    assert c.ratio(300) == pytest.approx(0.2)
    assert c.learning_rate(1.0, 300) == pytest.approx(1 / 1.4)
    tight = SampleStaleness(batch=20, capacity=50, tolerance=0.1, max_capacity=50,
                            min_batch=16, lam=0.0)
    assert tight.control(50) == "shrink_batch" and tight.batch == 16  # not below the floor
    assert tight.control(50) is None                                   # nothing left to do
