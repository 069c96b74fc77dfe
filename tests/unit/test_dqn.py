"""Double DQN's math against references written from the papers, per sample, in loops."""

import numpy as np
import pytest
import torch

from dask_rl.algos import dqn, replay


def _reference_targets(rewards, terminated, truncated, bootstrap, gamma, n):
    """Rainbow's n-step return with a double-Q bootstrap, one sample at a time: sum discounted
    rewards until n steps, the episode's end or the trajectory's end; then add gamma^m times
    the bootstrap unless the episode terminated."""
    T, N = rewards.shape
    out = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            g = 0.0
            for k in range(n):
                j = t + k
                g += gamma**k * rewards[j, i]
                if terminated[j, i]:
                    break                              # terminal: nothing follows
                if truncated[j, i] or k == n - 1 or j == T - 1:
                    g += gamma ** (k + 1) * bootstrap[j, i]
                    break
            out[t, i] = g
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_targets_match_the_definition_per_sample(n):
    rng = np.random.default_rng(n)
    T, N, gamma = 12, 5, 0.9
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.15
    truncated = rng.random((T, N)) < 0.1
    terminated[3, 1] = truncated[3, 1] = True   # both at once: Gymnasium may say so
    bootstrap = rng.normal(size=(T, N)).astype(np.float32)
    got = replay.n_step_targets(rewards, terminated, terminated | truncated, bootstrap, gamma, n)
    want = _reference_targets(rewards, terminated, truncated, bootstrap, gamma, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_worked_example():
    # one env, 4 steps, n = 2, gamma = 0.5; the episode terminates at step 1, is truncated
    # at step 3 (the trajectory's last)
    rewards = np.array([[1.0], [2.0], [4.0], [8.0]], np.float32)
    terminated = np.array([[False], [True], [False], [False]])
    truncated = np.array([[False], [False], [False], [True]])
    boot = np.array([[10.0], [20.0], [30.0], [40.0]], np.float32)
    got = replay.n_step_targets(rewards, terminated, terminated | truncated, boot, 0.5, 2)[:, 0]
    # t=0: 1 + 0.5*2 (terminated: no bootstrap) = 2
    # t=1: 2 (terminated)
    # t=2: 4 + 0.5*8 + 0.25*40 (truncated after step 3: bootstrap of the final obs) = 18
    # t=3: 8 + 0.5*40 = 28
    np.testing.assert_allclose(got, [2.0, 2.0, 18.0, 28.0])


def test_the_loss_is_huber_of_the_taken_actions_error():
    q = torch.tensor([[1.0, 5.0], [0.0, -2.0], [3.0, 3.0]])
    actions = torch.tensor([1, 0, 1])
    targets = torch.tensor([4.5, 3.0, 3.2])
    taken = dqn.q_taken(q, actions)
    assert taken.tolist() == [5.0, 0.0, 3.0]
    # Huber, delta 1: 0.5 e^2 inside [-1, 1], |e| - 0.5 outside
    errors = [0.5, -3.0, -0.2]
    want = np.mean([0.5 * e * e if abs(e) <= 1 else abs(e) - 0.5 for e in errors])
    assert dqn.td_loss(taken, targets).item() == pytest.approx(want)


def test_epsilon_decays_linearly_then_holds():
    kw = {"start": 1.0, "end": 0.05, "decay_steps": 1000}
    assert dqn.epsilon(0, **kw) == 1.0
    assert dqn.epsilon(500, **kw) == pytest.approx(0.525)
    assert dqn.epsilon(1000, **kw) == dqn.epsilon(10**6, **kw) == 0.05


def test_epsilon_greedy_explores_at_rate_epsilon_and_is_greedy_otherwise():
    rng = np.random.default_rng(1)
    q = np.tile(np.array([0.0, 1.0, 0.0, 0.0]), (20_000, 1))
    assert (dqn.epsilon_greedy(q, 0.0, rng) == 1).all()
    picks = dqn.epsilon_greedy(q, 0.4, rng)
    # greedy 60% + a uniform pick of action 1 in 40% / 4 = 70% on action 1
    assert abs((picks == 1).mean() - 0.7) < 0.02
    assert abs((picks == 0).mean() - 0.1) < 0.01


def _scripted_trajectory(rng, T=10, N=3):
    from dask_rl.data import Trajectory

    obs = (np.arange(T)[:, None] * 10 + np.arange(N)[None, :]).astype(np.float32)[..., None]
    terminated = rng.random((T, N)) < 0.15
    truncated = (rng.random((T, N)) < 0.15) & ~terminated
    terminated[T - 1, 0], truncated[T - 1, 0] = False, True   # a time limit at the last step
    trunc_index = np.argwhere(truncated).astype(np.int32)
    return Trajectory(
        obs=obs, actions=rng.integers(0, 2, (T, N)),
        rewards=rng.normal(size=(T, N)).astype(np.float32), terminated=terminated,
        truncated=truncated, behaviour_logp=np.zeros((T, N), np.float32),
        last_obs=np.full((N, 1), -1.0, np.float32), trunc_index=trunc_index,
        trunc_obs=-100.0 - np.arange(len(trunc_index), dtype=np.float32)[:, None],
        policy_version=0)


@pytest.mark.parametrize("n", [1, 3])
def test_sampled_transitions_carry_the_right_return_discount_and_bootstrap_observation(n):
    rng = np.random.default_rng(7 + n)
    traj = _scripted_trajectory(rng)
    T, N, gamma = 10, 3, 0.9
    t = np.append(rng.integers(0, T, 39), T - 1)   # and the truncated last step, sampled
    i = np.append(rng.integers(0, N, 39), 0)
    got = replay.sample_transitions(traj, t, i, gamma=gamma, n=n)
    truncs = {(int(a), int(b)): k for k, (a, b) in enumerate(traj.trunc_index)}
    for row in range(40):
        start, env = int(t[row]), int(i[row])
        g, disc, nxt = 0.0, None, None
        for k in range(n):
            j = start + k
            g += gamma**k * traj.rewards[j, env]
            if traj.terminated[j, env]:
                disc = 0.0
                break
            if traj.truncated[j, env]:          # the episode's final observation
                disc, nxt = gamma ** (k + 1), traj.trunc_obs[truncs[(j, env)]]
                break
            if j == T - 1:                      # the trajectory's end
                disc, nxt = gamma ** (k + 1), traj.last_obs[env]
                break
            if k == n - 1:
                disc, nxt = gamma ** (k + 1), traj.obs[j + 1, env]
        assert got.returns[row] == pytest.approx(g, abs=1e-5)
        assert got.discounts[row] == pytest.approx(disc)
        if disc:
            np.testing.assert_array_equal(got.next_obs[row], nxt)
        np.testing.assert_array_equal(got.obs[row], traj.obs[start, env])
        assert got.actions[row] == traj.actions[start, env]


def _q_model(weight, bias):
    """A 2-input, 3-action actor-critic whose action values are ``weight @ obs + bias``."""
    from gymnasium import spaces

    from dask_rl.config.schema import ModelConfig
    from dask_rl.models import make_model

    model = make_model(spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3),
                       ModelConfig(hidden=(2,), activation="relu"))
    with torch.no_grad():  # the torso passes obs through (identity on positive inputs)
        body = model.pi_body[0]
        body.weight.copy_(torch.eye(2))
        body.bias.zero_()
        model.pi_head.weight.copy_(torch.as_tensor(weight, dtype=torch.float32))
        model.pi_head.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return model


def test_the_trained_loss_is_double_q_per_sample():
    """``DQN.loss`` against van Hasselt et al.'s Eq. 4 written out per sample, with online
    and target networks that disagree on the best next action."""
    from dask_rl.algos.dqn import DQN, DQNConfig

    rng = np.random.default_rng(3)
    online = _q_model(rng.normal(size=(3, 2)), rng.normal(size=3))
    target = _q_model(rng.normal(size=(3, 2)), rng.normal(size=3))
    B = 64
    batch = {"obs": torch.as_tensor(rng.uniform(0.1, 1, (B, 2)), dtype=torch.float32),
             "actions": torch.as_tensor(rng.integers(0, 3, B)),
             "returns": torch.as_tensor(rng.normal(size=B), dtype=torch.float32),
             "discounts": torch.as_tensor(rng.choice([0.0, 0.9, 0.81], B), dtype=torch.float32),
             "next_obs": torch.as_tensor(rng.uniform(0.1, 1, (B, 2)), dtype=torch.float32)}
    loss, _ = DQN(DQNConfig()).loss(online, target, batch)

    def q(model, x):
        w = model.pi_head.weight.detach().numpy()
        b = model.pi_head.bias.detach().numpy()
        return [float(w[a] @ np.maximum(x, 0) + b[a]) for a in range(3)]

    want, disagree = 0.0, 0
    for j in range(B):
        x1 = batch["next_obs"][j].numpy()
        q_online_next, q_target_next = q(online, x1), q(target, x1)
        a_star = max(range(3), key=lambda a: q_online_next[a])      # the online net chooses
        disagree += a_star != max(range(3), key=lambda a: q_target_next[a])
        y = float(batch["returns"][j]) + float(batch["discounts"][j]) * q_target_next[a_star]
        e = q(online, batch["obs"][j].numpy())[int(batch["actions"][j])] - y
        want += 0.5 * e * e if abs(e) <= 1 else abs(e) - 0.5
    assert disagree > 5   # the case where double and plain DQN differ is exercised
    assert loss.item() == pytest.approx(want / B, rel=1e-5)


def test_a_learner_takes_one_step_per_batch_at_the_rate_it_was_given():
    from gymnasium import spaces

    from dask_rl.algos.replay import Transitions
    from dask_rl.config import from_dict
    from dask_rl.data import PolicySnapshot
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.learner import Learner

    cfg = from_dict({"algo": {"name": "dqn"}, "env": {"id": "CartPole-v1"},
                     "learner": {"max_grad_norm": 0}}, check_env=False)
    obs_space, act_space = spaces.Box(-5, 5, (4,), np.float32), spaces.Discrete(2)
    params = get_flat(make_model(obs_space, act_space, cfg.model, seed=0))
    rng = np.random.default_rng(0)
    rows = 5 * 32 + 7                      # 5 whole batches of 32; the 7 left over are unused
    t = Transitions(obs=rng.normal(size=(rows, 4)).astype(np.float32),
                    actions=rng.integers(0, 2, rows), returns=np.ones(rows, np.float32),
                    discounts=np.full(rows, 0.9, np.float32),
                    next_obs=rng.normal(size=(rows, 4)).astype(np.float32))
    learner = Learner(cfg, obs_space, act_space, device="cpu")
    update = learner.update_transitions(PolicySnapshot(0, params), t, lr=1e-3, batch_size=32,
                                        seed=1)
    assert update.stats["learner/epochs"] == 5 and update.finite
    # Adam's steps move each coordinate by at most about lr per step
    assert 0 < np.abs(update.delta).max() <= 5 * 1e-3 * 1.01
    assert update.opt_state["t"] == 5
    # One batch is one Adam step from fresh moments: every coordinate with a gradient moves by
    # lr |g| / (|g| + eps), i.e. by the rate given (not the config's learner.lr, 2.5e-4).
    one = Transitions(obs=t.obs[:32], actions=t.actions[:32], returns=t.returns[:32],
                      discounts=t.discounts[:32], next_obs=t.next_obs[:32])
    for lr in (1e-3, 1e-4):
        step = Learner(cfg, obs_space, act_space, device="cpu").update_transitions(
            PolicySnapshot(0, params), one, lr=lr, batch_size=32, seed=1)
        assert np.abs(step.delta).max() == pytest.approx(lr, rel=1e-3)


@pytest.mark.parametrize("strategy", ["sync", "ssp", "softsync", "stellaris", "tianji"])
def test_dqn_refuses_every_strategy_but_async(strategy):
    from dask_rl.config import ConfigError
    from dask_rl.config.loader import from_dict

    with pytest.raises(ConfigError, match="aggregation.strategy: only 'async'"):
        from_dict({"algo": {"name": "dqn"}, "aggregation": {"strategy": strategy}},
                  check_env=False)
    assert from_dict({"algo": {"name": "dqn"}}, check_env=False).aggregation.strategy == "async"


def test_a_replay_learner_bootstraps_from_the_snapshots_target_network():
    """The bootstrap is valued by the target network the snapshot carries (Mnih et al. 2015),
    not by the online parameters: changing only the target changes the update where there is
    a bootstrap (discount > 0) and changes nothing where there is none."""
    from gymnasium import spaces

    from dask_rl.algos.replay import Transitions
    from dask_rl.config import from_dict
    from dask_rl.data import PolicySnapshot
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.learner import Learner

    cfg = from_dict({"algo": {"name": "dqn"}, "env": {"id": "CartPole-v1"},
                     "learner": {"max_grad_norm": 0}}, check_env=False)
    obs_space, act_space = spaces.Box(-5, 5, (4,), np.float32), spaces.Discrete(2)
    online = get_flat(make_model(obs_space, act_space, cfg.model, seed=0))
    other = get_flat(make_model(obs_space, act_space, cfg.model, seed=1))
    rng = np.random.default_rng(3)

    def delta(target, discount):
        t = Transitions(obs=rng.normal(size=(32, 4)).astype(np.float32),
                        actions=np.arange(32) % 2, returns=np.ones(32, np.float32),
                        discounts=np.full(32, discount, np.float32),
                        next_obs=np.linspace(-2, 2, 128, dtype=np.float32).reshape(32, 4))
        snap = PolicySnapshot(0, online, target_params=target)
        return Learner(cfg, obs_space, act_space, device="cpu").update_transitions(
            snap, t, lr=1e-3, batch_size=32, seed=1).delta

    def twice(discount):   # the same transitions, valued by the online then the other net
        state = rng.bit_generator.state
        first = delta(online, discount)
        rng.bit_generator.state = state
        return first, delta(other, discount)

    assert not np.allclose(*twice(0.9))
    np.testing.assert_array_equal(*twice(0.0))
