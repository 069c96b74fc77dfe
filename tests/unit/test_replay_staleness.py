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


def test_whole_trajectories_a_capacity_that_is_not_a_multiple_still_ends_under_tolerance():
    # 200-transition trajectories, B = 128: P <= 0.2 needs 640 held; the cap of 700 holds only
    # three trajectories (600): full there, so the batch shrinks to floor(0.2 x 600) = 120
    c = SampleStaleness(batch=128, capacity=400, tolerance=0.2, max_capacity=700,
                        min_batch=16, chunk=200)
    assert c.control(400) == "grow_buffer" and c.capacity == 700
    assert c.full(600) and c.control(600) == "shrink_batch" and c.batch == 120
    roomy = SampleStaleness(batch=128, capacity=400, tolerance=0.2, max_capacity=10_000,
                            min_batch=16, chunk=200)
    assert roomy.control(400) == "grow_buffer" and roomy.capacity == 800  # 640 -> 4 chunks
    assert roomy.control(800) is None and roomy.ratio(800) == 0.16


@pytest.mark.parametrize("seed", range(25))
def test_filling_a_real_buffer_drives_p_under_the_tolerance(seed):
    """A buffer fed trajectory after trajectory, the controller asked before each learner, as
    the driver does: at the end P <= tolerance, or the batch is at its floor."""
    rng = np.random.default_rng(seed)
    chunk = int(rng.integers(50, 600))
    tol = float(rng.uniform(0.05, 0.5))
    start = int(rng.integers(chunk, 4 * chunk))
    c = SampleStaleness(batch=int(rng.integers(64, 4096)), capacity=start, tolerance=tol,
                        max_capacity=int(rng.integers(start, 40 * chunk)), min_batch=8,
                        chunk=chunk)
    b = TransitionReplay(capacity=start)
    for k in range(200):
        b.add(k, steps=chunk, envs=1)
        c.control(b.size)
        b.capacity = c.capacity
        assert b.size <= max(b.capacity, chunk)
    assert c.ratio(b.size) <= tol + 1e-12 or c.batch == c.min_batch, (c, b.size)


def test_restoring_a_grown_buffer_keeps_every_saved_trajectory():
    """A checkpoint of a buffer grown past the configured capacity comes back whole."""
    grown = TransitionReplay(capacity=100)
    grown.capacity = 400                     # what sample-staleness control grew it to
    for k in range(6):
        grown.add(f"t{k}", steps=16, envs=4)  # 6 x 64 = 384 transitions, all kept
    resumed = TransitionReplay(capacity=100)  # the configured capacity, as on resume
    resumed.restore(grown.items())
    assert resumed.items() == grown.items() and resumed.size == 384
    resumed.capacity = 400                    # the driver's state, restored after
    assert resumed.add("t6", steps=16, envs=4) == ["t0"]
