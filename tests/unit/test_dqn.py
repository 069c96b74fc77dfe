"""Double DQN's math against references written from the papers, per sample, in loops."""

import numpy as np
import pytest
import torch

from dask_rl.algos import dqn


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
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    bootstrap = rng.normal(size=(T, N)).astype(np.float32)
    got = dqn.n_step_targets(rewards, terminated, terminated | truncated, bootstrap, gamma, n)
    want = _reference_targets(rewards, terminated, truncated, bootstrap, gamma, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_worked_example():
    # one env, 4 steps, n = 2, gamma = 0.5; the episode terminates at step 1, is truncated
    # at step 3 (the trajectory's last)
    rewards = np.array([[1.0], [2.0], [4.0], [8.0]], np.float32)
    terminated = np.array([[False], [True], [False], [False]])
    truncated = np.array([[False], [False], [False], [True]])
    boot = np.array([[10.0], [20.0], [30.0], [40.0]], np.float32)
    got = dqn.n_step_targets(rewards, terminated, terminated | truncated, boot, 0.5, 2)[:, 0]
    # t=0: 1 + 0.5*2 (terminated: no bootstrap) = 2
    # t=1: 2 (terminated)
    # t=2: 4 + 0.5*8 + 0.25*40 (truncated after step 3: bootstrap of the final obs) = 18
    # t=3: 8 + 0.5*40 = 28
    np.testing.assert_allclose(got, [2.0, 2.0, 18.0, 28.0])


def test_double_q_lets_the_online_network_choose_and_the_target_network_value():
    rng = np.random.default_rng(0)
    online = rng.normal(size=(6, 4, 3))
    target = rng.normal(size=(6, 4, 3))
    got = dqn.double_q_bootstrap(online, target)
    for t in range(6):
        for i in range(4):
            best = max(range(3), key=lambda a: online[t, i, a])
            assert got[t, i] == target[t, i, best]
    # not the target network's own max (that would be plain DQN's overestimating target)
    assert not np.allclose(got, target.max(-1))


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
    t = rng.integers(0, T, 40)
    i = rng.integers(0, N, 40)
    got = dqn.sample_transitions(traj, t, i, gamma=gamma, n=n)
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
