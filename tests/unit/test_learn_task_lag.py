"""The learner task body (``dask_rl.runtime.tasks._learn``) tells TianJi how stale its data was.

A trajectory is collected by the real collector of a real :class:`RunState` at policy version 0;
the real :class:`ParameterActor` then moves on by a known number of versions before the learner
task pulls and pushes. The push must carry the versions between the collecting policy and the
learner's pull (``sample_lag``), so that TianJi (``aggregation.lag_tolerance``) counts the
gradient's samples as stale exactly when that lag exceeds the tolerance: its share of stale
samples ``P`` and the weight ``1 / (1 + lam P)`` of the applied step follow. The expected
numbers are written out by hand, not computed with the code under test.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from dask_rl.config import from_dict
from dask_rl.runtime import tasks
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.runtime.plugins import RunState

RUN = "lag-test"
STEPS, ENVS = 16, 2          # each rollout is 32 env steps


class InProcessHandle:
    """An :class:`~dask_rl.runtime.handle.ActorHandle` stand-in: calls the actor directly."""

    epoch = None
    key = "actor"

    def __init__(self, actor: ParameterActor):
        self.actor = actor

    def call(self, name, *args, **kwargs):
        return getattr(self.actor, name)(*args, **kwargs)


def _run_state(tolerance: int) -> RunState:
    cfg = from_dict({"aggregation": {"strategy": "tianji", "lag_tolerance": tolerance,
                                     "lam": 1.0},
                     "rollout": {"steps": STEPS}, "env": {"num_envs": ENVS},
                     "learner": {"epochs": 1, "minibatches": 1, "device": "cpu"}})
    state = RunState(RUN, cfg)
    state.setup(SimpleNamespace(address="inproc://lag-test", name=0))
    return state


def _actor(state: RunState) -> ParameterActor:
    from dask_rl.models import get_flat

    params = get_flat(state.learner().model)
    return ParameterActor(params, state.cfg.aggregation, learners=state.cfg.learner.max_learners,
                          run=RUN)


# (lag, lag_tolerance, the 32 samples count as stale)
CASES = [(2, 1, True), (1, 1, False), (1, 0, True), (0, 0, False), (3, 2, True)]


@pytest.mark.parametrize(("lag", "tolerance", "stale"), CASES)
def test_the_learner_push_reports_the_sample_lag_tianji_judges(lag, tolerance, stale):
    state = _run_state(tolerance)
    try:
        actor = _actor(state)
        handle = InProcessHandle(actor)
        traj = tasks._collect(state, 0, handle)
        assert traj.policy_version == 0 and traj.env_steps == 32

        # Other learners move the parameters on while the trajectory waits: `lag` versions.
        # Their pushes report no samples, so TianJi's window holds only the learner's below.
        zeros = np.zeros_like(actor.current.params)
        for v in range(lag):
            assert actor.push(zeros, v, f"other-{v}").status == "applied"
        assert actor.metrics()["version"] == lag and actor.metrics()["tianji/P"] == 0.0

        report = tasks._learn(RUN, state, traj, handle, "L0", 2.5e-4, 0, None, True, None)

        assert report.version_pulled == lag and report.policy_lag == lag
        assert report.worker == "inproc://lag-test"
        assert list(actor.strategy.recent) == [(32, 32 if stale else 0)]
        m = actor.metrics()
        assert m["tianji/P"] == (1.0 if stale else 0.0)
        assert m["version"] == lag + 1 and m["gradients/applied"] == lag + 1
        # lam = 1: a stale gradient is applied at half weight, a fresh one at full weight
        assert report.ack.status == "applied"
        assert report.ack.weight == pytest.approx(0.5 if stale else 1.0)
        assert m["lr_scale"] == pytest.approx(0.5 if stale else 1.0)
    finally:
        state.teardown(state.worker)


def test_stale_and_fresh_pushes_share_the_window():
    """Two learner tasks on one actor: one fresh (lag 0), one stale (lag 2 > tolerance 1);
    P is the stale share of the 64 samples learned, 32 / 64."""
    state = _run_state(1)
    try:
        actor = _actor(state)
        handle = InProcessHandle(actor)
        old = tasks._collect(state, 0, handle)                     # version 0
        fresh = tasks._collect(state, 1, handle)                   # version 0
        first = tasks._learn(RUN, state, fresh, handle, "L0", 2.5e-4, 0, None, True, 0)
        assert first.policy_lag == 0 and first.ack.weight == pytest.approx(1.0)
        actor.push(np.zeros_like(actor.current.params), 1, "other")  # now at version 2
        second = tasks._learn(RUN, state, old, handle, "L1", 2.5e-4, 1, None, True, 1)
        assert second.policy_lag == 2
        assert list(actor.strategy.recent) == [(32, 0), (32, 32)]
        assert actor.metrics()["tianji/P"] == pytest.approx(0.5)
        assert second.ack.weight == pytest.approx(1 / 1.5)
    finally:
        state.teardown(state.worker)
