"""The parameter actor as a plain object: versions, snapshots, optimizer state, rejection."""

import numpy as np
import pytest

from dask_rl.data import PushAck
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.staleness import AsyncConfig, SyncConfig, TianjiConfig


def test_pull_is_cheap_when_current_and_snapshots_are_immutable():
    a = ParameterActor(np.zeros(4, np.float32), AsyncConfig(alpha0=0.5))
    snap = a.pull()
    assert snap.version == 0
    assert a.pull(newer_than=0) is None
    ack = a.push(np.ones(4, np.float32), 0, "L1")
    assert ack == PushAck("applied", version=1, staleness=0, weight=1.0)
    np.testing.assert_array_equal(snap.params, np.zeros(4))  # old snapshot untouched
    np.testing.assert_array_equal(a.pull(newer_than=0).params, -0.5 * np.ones(4))


def test_nan_and_wrong_shape_gradients_are_rejected_and_never_applied():
    a = ParameterActor(np.zeros(3, np.float32), SyncConfig())
    a.pull(learner_id="L1")
    bad = np.array([1.0, np.nan, 0.0], np.float32)
    assert a.push(bad, 0, "L1").status == "rejected"
    assert a.push(np.zeros(5, np.float32), 0, "L2").status == "rejected"
    assert a.push(np.array([np.inf, 0, 0], np.float32), 0, "L3").status == "rejected"
    assert a.metrics()["gradients/rejected"] == 3
    np.testing.assert_array_equal(a.pull().params, np.zeros(3))
    # the sync barrier is not left waiting for the rejected learner
    a.pull(learner_id="L4")
    assert a.push(np.ones(3, np.float32), 0, "L4").status == "applied"


def test_learners_that_keep_their_own_moments_pull_and_push_none():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0))
    a.pull(learner_id="A", learner_state=True)
    sa = {"m": np.array([1, 1], np.float32), "v": np.array([2, 2], np.float32), "t": 4}
    a.push(np.array([1, 0], np.float32), 0, "A", opt_state=sa)
    assert a.pull_learner("B").opt_state["t"] == 4          # shared: the moments travel
    snap = a.pull_learner("C", opt_state=False)             # local: they stay behind
    assert snap.opt_state is None and snap.version == 1
    np.testing.assert_allclose(snap.params, [-1, 0])
    assert a.push(np.array([0, 1], np.float32), 1, "C").status == "applied"
    assert a.opt_state["t"] == 4  # a push without moments leaves the actor's as they were


def test_sync_averages_and_learner_optimizer_state_is_averaged():
    a = ParameterActor(np.zeros(2, np.float32), SyncConfig(alpha0=1.0))
    a.pull(learner_id="A", learner_state=True)
    a.pull(learner_id="B", learner_state=True)
    sa = {"m": np.array([1, 1], np.float32), "v": np.array([2, 2], np.float32), "t": 4}
    sb = {"m": np.array([3, 3], np.float32), "v": np.array([4, 4], np.float32), "t": 8}
    assert a.push(np.array([2, 0], np.float32), 0, "A", opt_state=sa).status == "buffered"
    assert a.push(np.array([0, 2], np.float32), 0, "B", opt_state=sb).status == "applied"
    snap = a.pull(learner_state=True)
    np.testing.assert_allclose(snap.params, [-1, -1])
    np.testing.assert_allclose(snap.opt_state["m"], [2, 2])
    np.testing.assert_allclose(snap.opt_state["v"], [3, 3])
    assert snap.opt_state["t"] == 6
    # the effective step: a synchronous round, theta - alpha0 (1/H) sum_j g_j with H = 2,
    # weighs each gradient 1/2
    assert a.metrics()["gradients/weight_sum"] == 1.0 and a.metrics()["gradients/applied"] == 2


def test_state_roundtrip_restores_version_and_drops_buffers():
    a = ParameterActor(np.zeros(2, np.float32), SyncConfig())
    a.pull(learner_id="A")
    a.push(np.ones(2, np.float32), 0, "A")
    state = a.state_dict()
    b = ParameterActor(np.zeros(2, np.float32), SyncConfig())
    assert b.load_state_dict(state) == 1
    np.testing.assert_array_equal(b.pull().params, a.pull().params)
    assert b.metrics()["gradients/applied"] == 1
    assert b.metrics()["gradients/weight_sum"] == a.metrics()["gradients/weight_sum"] == 1.0


def test_learners_see_each_others_current_parameters_for_is_truncation():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(), keep_versions=2)
    for v in range(5):
        a.push(np.ones(2, np.float32), v, "L")
    assert sorted(a.history) == [3, 4, 5]
    x = a.pull_learner("X")                       # X holds version 5
    a.push(np.ones(2, np.float32), 5, "L")        # version 6
    a.pull_learner("Y")
    # Y has published nothing yet: X sees the version Y pulled
    np.testing.assert_array_equal(a.exchange("X", x.params + 0.5)[0], a.history[6].params)
    # Y sees X's *current* local parameters, not the version X started from
    np.testing.assert_array_equal(a.exchange("Y", np.full(2, 9.0, np.float32))[0],
                                  x.params + 0.5)
    np.testing.assert_array_equal(a.exchange("X", x.params)[0], np.full(2, 9.0))
    a.push(np.ones(2, np.float32), 5, "X")        # X is done: nobody sees it any more
    assert a.exchange("Y", np.zeros(2, np.float32)) == []
    a.learner_lost("Y")
    assert a.published == {}


def test_ssp_read_gate_makes_a_learner_wait_at_pull():
    from dask_rl.staleness import SSPConfig

    a = ParameterActor(np.zeros(2, np.float32), SSPConfig(bound=0))
    assert a.pull_learner("A") is not None and a.pull_learner("B") is not None
    a.push(np.ones(2, np.float32), 0, "A")        # version 1, B still computes on v0
    assert a.pull_learner("C") is None            # C would be 1 ahead of B: not yet
    a.push(np.ones(2, np.float32), 0, "B")
    assert a.pull_learner("C").version == 2


def test_gradients_from_before_an_exploit_are_dropped():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig())
    a.pull_learner("L")                           # L learns from the loser's weights
    a.adopt({"params": np.full(2, 5.0, np.float32)})
    ack = a.push(np.ones(2, np.float32), 0, "L")
    assert ack.status == "dropped"
    np.testing.assert_array_equal(a.pull().params, np.full(2, 5.0))
    assert a.metrics()["gradients/superseded"] == 1


def test_a_push_is_taken_at_most_once():
    """A learner task Dask re-ran after its worker died having pushed: the second push changes
    nothing — not the parameters, not the statistics — and is counted."""
    from dask_rl.models.normalizer import batch_moments, empty_moments

    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0),
                       moments={"obs": empty_moments(1)}, run="r", epoch="e0")
    delta = np.ones(2, np.float32)
    obs = {"obs": batch_moments(np.arange(5.0).reshape(5, 1))}
    first = a.push(delta, 0, "L7", seq=7, epoch="e0", run="r", moments=obs)
    assert first.status == "applied"
    params, count = a.pull().params.copy(), a.pull().moments["obs"][0]
    assert count == 5
    again = a.push(delta, 0, "L7", seq=7, epoch="e0", run="r", moments=obs)
    assert again.status == "refused" and again.version == 1
    np.testing.assert_array_equal(a.pull().params, params)
    assert a.pull().moments["obs"][0] == count
    m = a.metrics()
    assert m["pushes/refused"] == 1 and m["pushes/distinct"] == 1
    assert m["gradients/arrived"] == m["gradients/applied"] == 1
    # another sequence number from the same learner id is a different push
    assert a.push(delta, 1, "L7", seq=8, epoch="e0", run="r").status == "applied"


def test_pushes_from_another_epoch_or_run_are_refused():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0), run="r", epoch="e1")
    d = np.ones(2, np.float32)
    assert a.push(d, 0, "L1", seq=1, epoch="e0", run="r").status == "refused"
    assert a.push(d, 0, "L2", seq=2, epoch="e1", run="other").status == "refused"
    np.testing.assert_array_equal(a.pull().params, np.zeros(2))
    assert a.metrics()["pushes/refused"] == 2 and a.metrics()["gradients/arrived"] == 0
    # a refused push does not use up its sequence number
    assert a.push(d, 0, "L1", seq=1, epoch="e1", run="r").status == "applied"


def test_a_recreated_actor_refuses_what_its_checkpoint_holds():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0), run="r", epoch="e0")
    for seq in (3, 1, 2):
        a.push(np.ones(2, np.float32), a.pull().version, f"L{seq}", seq=seq, epoch="e0",
               run="r")
    state = a.state_dict()
    b = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0), run="r", epoch="e1")
    b.load_state_dict(state)
    assert b.metrics()["pushes/distinct"] == 3
    for seq in (1, 2, 3):  # re-run learners reaching the new actor
        assert b.push(np.ones(2, np.float32), 3, f"L{seq}", seq=seq, epoch="e1",
                      run="r").status == "refused"
    assert b.push(np.ones(2, np.float32), 3, "L4", seq=4, epoch="e1", run="r").status \
        == "applied"
    assert b.pull().version == 4


def test_a_refused_repeat_releases_its_learner_from_the_barrier():
    """A re-run learner pulls again (becoming active) before its push is refused: the sync
    barrier must not wait for it forever."""
    a = ParameterActor(np.zeros(2, np.float32), SyncConfig(alpha0=1.0), run="r", epoch="e")
    d = np.ones(2, np.float32)
    a.pull(learner_id="L1")
    a.pull(learner_id="L2")
    assert a.push(d, 0, "L1", seq=1, epoch="e", run="r").status == "buffered"
    assert a.push(d, 0, "L2", seq=2, epoch="e", run="r").status == "applied"
    a.pull(learner_id="L1")  # Dask re-runs L1 after its worker died having pushed
    assert a.push(d, 1, "L1", seq=1, epoch="e", run="r").status == "refused"
    a.pull(learner_id="L3")
    assert a.push(d, 1, "L3", seq=3, epoch="e", run="r").status == "applied"
    assert a.metrics()["learners/active"] == 0


def test_an_event_triggered_pull_moves_parameters_only_when_they_moved_enough():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig())
    for _ in range(3):
        a.pull(learner_id="L")
        a.push(np.ones(2, np.float32), a.current.version, "L")
    assert a.current.version == 3
    assert a.pull(newer_than=1, min_versions=3) is None          # moved by 2 < 3
    assert a.pull(newer_than=0, min_versions=3).version == 3     # moved by 3
    assert a.pull(newer_than=3) is None                          # the default: unchanged
    assert a.pull(newer_than=-1, min_versions=10).version == 3   # holds nothing: always
    assert a.pull(newer_than=7, min_versions=10).version == 3    # behind the caller: always
    # a rollout slot's pulls are counted apart: asked, and answered with parameters
    assert a.metrics()["actor/rollout_pulls"] == 0
    assert a.pull(newer_than=1, min_versions=3, slot=0) is None
    assert a.pull(newer_than=0, min_versions=3, slot=1).version == 3
    m = a.metrics()
    assert (m["actor/rollout_pulls"], m["actor/rollout_loads"]) == (2, 1)
    restored = ParameterActor(np.zeros(2, np.float32), AsyncConfig())
    restored.load_state_dict(a.state_dict())
    assert restored.metrics()["actor/rollout_pulls"] == 2


def test_tianji_step_is_the_one_applied_to_the_parameters():
    """alpha0 / (1 + lambda P) reaches theta: with plain SGD, theta moves by exactly that."""
    a = ParameterActor(np.zeros(2, np.float32), TianjiConfig(alpha0=0.5, lam=3.0))
    a.pull(learner_id="A")
    a.push(np.ones(2, np.float32), 0, "A", samples=30, sample_lag=1)    # fresh: P = 0, step 0.5
    a.pull(learner_id="B")
    ack = a.push(np.ones(2, np.float32), 1, "B", samples=10, sample_lag=2)  # P = 10/40
    assert ack.status == "applied" and ack.weight == pytest.approx(1 / 1.75)
    np.testing.assert_allclose(a.pull().params, (-0.5 - 0.5 / 1.75) * np.ones(2), rtol=1e-6)


def test_the_target_network_keeps_the_statistics_it_was_taken_with():
    """pi_target is the target's parameters under the normaliser of its version: statistics
    merged after a refresh move the current policy's normaliser, not the target's."""
    from dask_rl.models.normalizer import batch_moments, empty_moments

    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0),
                       moments={"obs": empty_moments(1)}, target_every=2)
    data: list[float] = []
    for v in range(4):
        a.pull(learner_id=f"L{v}")
        a.push(np.ones(2, np.float32), v, f"L{v}", moments={"obs": batch_moments(
            np.full((3, 1), float(v)))})
        data += [float(v)] * 3
        snap = a.pull_learner(f"probe{v}")
        held = (v + 1) // 2 * 2 * 3          # samples merged when the target was taken
        want = (batch_moments(np.array(data[:held]).reshape(-1, 1)) if held
                else empty_moments(1))
        np.testing.assert_allclose(snap.target_moments["obs"], want)
        np.testing.assert_allclose(snap.moments["obs"],
                                   batch_moments(np.array(data).reshape(-1, 1)))
    a.pull(learner_id="L4")    # one more sample set after the last refresh
    a.push(np.ones(2, np.float32), 4, "L4", moments={"obs": batch_moments(np.ones((3, 1)))})
    restored = ParameterActor(np.zeros(2, np.float32), AsyncConfig(), target_every=2)
    restored.load_state_dict(a.state_dict())
    snap = restored.pull_learner("after")
    np.testing.assert_allclose(snap.target_moments["obs"],
                               batch_moments(np.array(data).reshape(-1, 1)))
    assert snap.moments["obs"][0] == 15 and snap.target_moments["obs"][0] == 12


def test_the_target_network_is_the_parameters_of_every_target_every_th_version():
    """Mnih et al. 2015: the target network is a copy of the parameters every C updates, held
    fixed in between. Each push here applies one update (async, plain SGD, step 1)."""
    c = 3
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(alpha0=1.0), target_every=c)
    params = {0: np.zeros(2)}
    for v in range(10):
        a.pull(learner_id=f"L{v}")
        a.push(np.array([1.0, float(v)], np.float32), v, f"L{v}")
        params[v + 1] = params[v] - np.array([1.0, float(v)])   # theta -= alpha0 * delta
        snap = a.pull_learner(f"probe{v}")
        assert snap.version == v + 1
        np.testing.assert_array_equal(snap.params, params[v + 1])
        held = (v + 1) // c * c              # the newest multiple of C, 0 before the first
        np.testing.assert_array_equal(snap.target_params, params[held])
