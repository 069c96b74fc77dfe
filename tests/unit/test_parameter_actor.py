"""The parameter actor as a plain object: versions, snapshots, optimizer state, rejection."""

import numpy as np

from dask_rl.data import PushAck
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.staleness import AsyncConfig, SyncConfig


def test_pull_is_cheap_when_current_and_snapshots_are_immutable():
    a = ParameterActor(np.zeros(4, np.float32), AsyncConfig(alpha0=0.5))
    snap = a.pull()
    assert snap.version == 0
    assert a.pull(newer_than=0) is None
    ack = a.push(np.ones(4, np.float32), 0, "L1")
    assert ack == PushAck("applied", version=1, staleness=0)
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


def test_state_roundtrip_restores_version_and_drops_buffers():
    a = ParameterActor(np.zeros(2, np.float32), SyncConfig())
    a.pull(learner_id="A")
    a.push(np.ones(2, np.float32), 0, "A")
    state = a.state_dict()
    b = ParameterActor(np.zeros(2, np.float32), SyncConfig())
    assert b.load_state_dict(state) == 1
    np.testing.assert_array_equal(b.pull().params, a.pull().params)
    assert b.metrics()["gradients/applied"] == 1


def test_history_keeps_recent_versions_for_is_truncation():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig(), keep_versions=2)
    for v in range(5):
        a.push(np.ones(2, np.float32), v, "L")
    assert sorted(a.history) == [3, 4, 5]
    a.pull(learner_id="X")
    a.push(np.ones(2, np.float32), 5, "L")       # version 6; X still holds 5
    snap, others = a.pull_learner("Y", cross=True)
    assert snap.version == 6 and [o.version for o in others] == [5]
    assert a.active_policies(exclude="X") == [6]
    _, none = a.pull_learner("Z")
    assert none == []
