"""The single-process building blocks: rollouts, learning, evaluation."""

import numpy as np

from dask_rl.config import from_dict
from dask_rl.data import PolicySnapshot
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat, make_model
from dask_rl.roles.collector import Collector
from dask_rl.roles.evaluation import evaluate
from dask_rl.roles.learner import Learner


def _setup(**cfg):
    cfg = from_dict(cfg)
    spaces = env_spaces(cfg.env)
    params = get_flat(make_model(*spaces, cfg.model, seed=0))
    return cfg, spaces, PolicySnapshot(0, params)


def test_rollout_shapes_and_episodes_continue_across_calls():
    cfg, _, snap = _setup(env={"num_envs": 3})
    rw = Collector(cfg, seed=1)
    rw.load(snap)
    t1 = rw.collect(50)
    assert t1.obs.shape == (50, 3, 4) and t1.actions.shape == (50, 3)
    assert t1.behaviour_logp.shape == (50, 3) and t1.policy_version == 0
    t2 = rw.collect(50)
    # the second call starts where the first stopped: same env state, not a reset
    np.testing.assert_array_equal(t2.obs[0], t1.last_obs)
    total_eps = len(t1.episode_returns) + len(t2.episode_returns)
    assert total_eps > 0  # a random CartPole policy ends episodes within 100 steps
    assert t1.env_steps == 150 and t1.nbytes > 0


def test_rollouts_are_reproducible_per_seed():
    cfg, _, snap = _setup()
    a, b = Collector(cfg, seed=5), Collector(cfg, seed=5)
    a.load(snap)
    b.load(snap)
    ta, tb = a.collect(20), b.collect(20)
    np.testing.assert_array_equal(ta.actions, tb.actions)
    np.testing.assert_array_equal(ta.obs, tb.obs)


def test_truncated_episodes_keep_their_final_observation():
    cfg, _, snap = _setup(env={"num_envs": 2, "kwargs": {"max_episode_steps": 5}})
    rw = Collector(cfg, seed=0)
    rw.load(snap)
    t = rw.collect(12)
    assert t.truncated.any()
    assert len(t.trunc_index) == int((t.truncated & ~t.terminated).sum())
    assert t.trunc_obs.shape == (len(t.trunc_index), 4)


def test_learner_update_improves_the_surrogate_and_carries_adam_state():
    cfg, spaces, snap = _setup()
    rw = Collector(cfg, seed=0)
    rw.load(snap)
    traj = rw.collect(128)
    learner = Learner(cfg, *spaces, device="cpu")
    res = learner.update(snap, traj, lr=3e-4, seed=0)
    assert res.delta.shape == snap.params.shape and np.isfinite(res.delta).all()
    assert np.linalg.norm(res.delta) > 0
    assert res.opt_state["t"] == cfg.learner.epochs * cfg.learner.minibatches
    assert res.stats["learner/samples"] == traj.env_steps
    # same inputs and seed, same update: learners are deterministic
    again = learner.update(snap, traj, lr=3e-4, seed=0)
    np.testing.assert_allclose(again.delta, res.delta, rtol=1e-5, atol=1e-7)
    # continuing from the returned Adam state differs from a fresh Adam
    warm = learner.update(PolicySnapshot(0, snap.params, opt_state=res.opt_state), traj,
                          lr=3e-4, seed=0)
    assert not np.allclose(warm.delta, res.delta)


def test_local_optimizer_state_stays_with_the_learner_and_continues_its_moments():
    """learner.optimizer_state = local: the update pushes no moments, and the learner's next
    update continues from its own, exactly as a shared-state learner handed those moments."""
    local_cfg, spaces, snap = _setup(learner={"optimizer_state": "local"})
    rw = Collector(local_cfg, seed=0)
    rw.load(snap)
    traj = rw.collect(128)
    local = Learner(local_cfg, *spaces, device="cpu")
    shared = Learner(from_dict({}), *spaces, device="cpu")
    # the actor hands moments anyway (a shared-state actor): a local learner ignores them
    stray = {"m": np.ones_like(snap.params), "v": np.ones_like(snap.params), "t": 7}
    first = local.update(PolicySnapshot(0, snap.params, opt_state=stray), traj, lr=3e-4, seed=0)
    assert first.opt_state is None
    ref_first = shared.update(snap, traj, lr=3e-4, seed=0)
    np.testing.assert_allclose(first.delta, ref_first.delta, rtol=1e-5, atol=1e-7)
    steps = local_cfg.learner.epochs * local_cfg.learner.minibatches
    assert local.local_opt_state["t"] == steps
    # the second update starts from the first's moments: t counts on, and the delta is the
    # one a shared learner computes when handed those moments
    second = local.update(PolicySnapshot(1, snap.params), traj, lr=3e-4, seed=1)
    assert local.local_opt_state["t"] == 2 * steps
    ref_second = shared.update(PolicySnapshot(1, snap.params, opt_state=ref_first.opt_state),
                               traj, lr=3e-4, seed=1)
    np.testing.assert_allclose(second.delta, ref_second.delta, rtol=1e-5, atol=1e-7)
    fresh = shared.update(PolicySnapshot(1, snap.params), traj, lr=3e-4, seed=1)
    assert not np.allclose(second.delta, fresh.delta)


def test_flat_buffers_collect_gradients_in_place():
    import torch

    from dask_rl.models import flatten_

    cfg, spaces, _ = _setup()
    model = make_model(*spaces, cfg.model, seed=0)
    before = get_flat(model)
    flat, grad = flatten_(model)
    np.testing.assert_array_equal(flat.numpy(), before)
    loss = sum((p ** 2).sum() for p in model.parameters())
    loss.backward()
    np.testing.assert_allclose(grad.numpy(), 2 * before, rtol=1e-6)
    assert all(p.grad.data_ptr() >= grad.data_ptr() for p in model.parameters())
    with torch.no_grad():
        flat.zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in model.parameters())


def test_greedy_evaluation_counts_whole_episodes():
    cfg, _, snap = _setup()
    result = evaluate(cfg, snap, episodes=5, seed=0)
    assert result.episodes == 5
    assert 8 <= result.mean_return <= 500


def test_truncation_exchanges_parameters_once_per_epoch():
    cfg, spaces, snap = _setup(learner={"epochs": 3, "is_truncation": True})
    rw = Collector(cfg, seed=0)
    rw.load(snap)
    traj = rw.collect(64)
    learner = Learner(cfg, *spaces, device="cpu")
    sent = []

    def alone(params):
        sent.append(params.copy())
        return []

    res = learner.update(snap, traj, lr=1e-3, seed=0, exchange=alone)
    assert len(sent) == 3                                  # one exchange per epoch
    np.testing.assert_array_equal(sent[0], snap.params)   # epoch 0 starts from the pull
    assert not np.array_equal(sent[1], sent[0])          # later epochs send current params
    assert res.stats["learner/cross_policies"] == 0
    other = get_flat(make_model(*spaces, cfg.model, seed=7))
    res = learner.update(snap, traj, lr=1e-3, seed=0, exchange=lambda p: [other])
    assert res.stats["learner/cross_policies"] == 1
    assert res.stats["learner/cross_forward_passes"] == 3
    assert res.stats["learner/cross_bytes"] == 3 * 2 * 4 * len(snap.params)
    assert 0 < res.stats["losses/is_truncated_frac"] <= 1


def test_the_target_policy_is_measured_under_the_target_statistics():
    """IMPACT's log pi_target(a|s): the target network's parameters under the observation
    normaliser it was taken with, not the current version's."""
    import torch

    from dask_rl.models import load_snapshot
    from dask_rl.models.normalizer import batch_moments

    cfg, spaces, snap = _setup(algo={"name": "impact"}, env={"normalize_obs": True})
    rw = Collector(cfg, seed=0)
    rw.load(snap)
    traj = rw.collect(64)
    rng = np.random.default_rng(0)
    current = {"obs": batch_moments(rng.normal(0.0, 1.0, (500, 4)))}
    target = {"obs": batch_moments(rng.normal(2.0, 3.0, (500, 4)))}
    target_params = snap.params + np.float32(0.1)
    learner = Learner(cfg, *spaces, device="cpu")
    got = learner._target_logp(PolicySnapshot(3, snap.params, current,
                                              target_params=target_params,
                                              target_moments=target), traj)
    model = make_model(*spaces, cfg.model, normalize_obs=True, seed=0)
    load_snapshot(model, PolicySnapshot(0, target_params, target))
    with torch.no_grad():
        dist = model.policy(torch.as_tensor(traj.obs.reshape(-1, 4)))
        want = dist.log_prob(torch.as_tensor(traj.actions.reshape(-1))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    load_snapshot(model, PolicySnapshot(0, target_params, current))
    with torch.no_grad():
        dist = model.policy(torch.as_tensor(traj.obs.reshape(-1, 4)))
        other = dist.log_prob(torch.as_tensor(traj.actions.reshape(-1))).numpy()
    assert np.abs(other - want).max() > 1e-4   # well outside the tolerance above
