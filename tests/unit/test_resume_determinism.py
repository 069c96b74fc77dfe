"""Save -> load restores the trainer exactly: the next update is bit-identical."""

import numpy as np

from dask_rl.checkpoint import CheckpointStore
from dask_rl.config import from_dict
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat, make_model
from dask_rl.roles.collector import Collector
from dask_rl.roles.learner import Learner
from dask_rl.runtime.parameter_actor import ParameterActor


def _update(actor, learner, traj, seed):
    snap = actor.pull(learner_id="L", learner_state=True)
    res = learner.update(snap, traj, lr=2.5e-4, seed=seed)
    return actor.push(res.delta, res.version, "L", opt_state=res.opt_state)


def test_resumed_trainer_makes_the_same_next_update(tmp_path):
    cfg = from_dict({"aggregation": {"strategy": "sync"}})
    spaces = env_spaces(cfg.env)
    actor = ParameterActor(get_flat(make_model(*spaces, cfg.model, seed=0)), cfg.aggregation)
    learner = Learner(cfg, *spaces, device="cpu")
    rw = Collector(cfg, seed=0)
    for step in range(3):  # some history: versions, Adam moments, strategy counters
        rw.load(actor.pull())
        _update(actor, learner, rw.collect(64), seed=step)
    rw.load(actor.pull())
    traj = rw.collect(64)

    store = CheckpointStore(tmp_path / "ck")
    store.save({"actor": actor.state_dict()}, meta={"algorithm": "ppo"})
    state, _ = store.load()
    np.testing.assert_array_equal(state["actor"]["params"], actor.pull().params)
    np.testing.assert_array_equal(state["actor"]["learner_opt"]["m"], actor.opt_state["m"])
    np.testing.assert_array_equal(state["actor"]["learner_opt"]["v"], actor.opt_state["v"])

    resumed = ParameterActor(np.zeros_like(actor.pull().params), cfg.aggregation)
    resumed.load_state_dict(state["actor"])
    fresh_learner = Learner(cfg, *spaces, device="cpu")
    a = _update(actor, learner, traj, seed=99)
    b = _update(resumed, fresh_learner, traj, seed=99)
    assert a == b and a.version == 4
    np.testing.assert_array_equal(actor.pull().params, resumed.pull().params)
    np.testing.assert_array_equal(actor.opt_state["m"], resumed.opt_state["m"])
    strategy = {k: v for k, v in actor.metrics().items() if not k.startswith("actor/")}
    assert strategy == {k: v for k, v in resumed.metrics().items() if not k.startswith("actor/")}


def test_a_non_finite_loss_is_rejected_not_applied():
    cfg = from_dict({})
    spaces = env_spaces(cfg.env)
    actor = ParameterActor(get_flat(make_model(*spaces, cfg.model, seed=0)), cfg.aggregation)
    learner = Learner(cfg, *spaces, device="cpu")
    rw = Collector(cfg, seed=0)
    rw.load(actor.pull())
    traj = rw.collect(32)
    traj.rewards[3, 1] = np.nan  # a broken environment
    res = learner.update(actor.pull(learner_id="L", learner_state=True), traj, lr=1e-3, seed=0)
    assert res.stats["learner/finite"] is False
    ack = actor.push(res.delta, res.version, "L", finite_loss=res.stats["learner/finite"])
    assert ack.status == "rejected" and ack.version == 0
    assert actor.metrics()["gradients/rejected"] == 1
