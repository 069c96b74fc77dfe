"""V-trace and the IMPACT loss against naive reference loops."""

import numpy as np
import pytest
import torch

from dask_rl.algos.base import Batch
from dask_rl.algos.impact import IMPACT, IMPACTConfig
from dask_rl.algos.ppo import next_values
from dask_rl.algos.vtrace import vtrace


def naive_vtrace_one_env(log_rhos, rewards, values, bootstrap, gamma, rho_bar, c_bar):
    """IMPALA's explicit sum, one episode segment, no episode end inside:
    v_s = V_s + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t."""
    T = len(rewards)
    ratios = np.exp(log_rhos)
    rhos, cs = np.minimum(rho_bar, ratios), np.minimum(c_bar, ratios)
    v_next = np.append(values[1:], bootstrap)
    deltas = rhos * (rewards + gamma * v_next - values)
    vs = np.zeros(T)
    for s in range(T):
        total, coef = 0.0, 1.0
        for t in range(s, T):
            total += (gamma ** (t - s)) * coef * deltas[t]
            coef *= cs[t]
        vs[s] = values[s] + total
    vs_next = np.append(vs[1:], bootstrap)
    adv = rhos * (rewards + gamma * vs_next - values)
    return vs, adv


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, 0.5), (1e9, 1e9)])
def test_vtrace_matches_the_explicit_sum(seed, rho_bar, c_bar):
    rng = np.random.default_rng(seed)
    T, N = 20, 3
    log_rhos = rng.normal(0, 0.5, (T, N))
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    last = rng.normal(size=N)
    nv = next_values(values, last, np.zeros((T, N), bool), np.zeros((T, N), bool),
                     np.zeros((0, 2), np.int32), np.zeros(0))
    vs, adv = vtrace(log_rhos, rewards, values, nv, np.zeros((T, N), bool), 0.9,
                     rho_bar=rho_bar, c_bar=c_bar)
    for n in range(N):
        want_vs, want_adv = naive_vtrace_one_env(log_rhos[:, n], rewards[:, n], values[:, n],
                                                 last[n], 0.9, rho_bar, c_bar)
        np.testing.assert_allclose(vs[:, n], want_vs, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(adv[:, n], want_adv, rtol=1e-9, atol=1e-9)


def test_on_policy_vtrace_is_the_n_step_return_and_respects_episode_ends():
    rng = np.random.default_rng(0)
    T = 12
    rewards = rng.normal(size=(T, 1))
    values = rng.normal(size=(T, 1))
    terminated = np.zeros((T, 1), bool)
    truncated = np.zeros((T, 1), bool)
    terminated[4, 0] = True   # episode 1 ends by termination at t = 4
    truncated[8, 0] = True    # episode 2 is cut at t = 8 (bootstrap from its final obs)
    trunc_value = 1.5
    last = np.array([0.7])
    nv = next_values(values, last, terminated, truncated, np.array([[8, 0]], np.int32),
                     np.array([trunc_value]))
    vs, _ = vtrace(np.zeros((T, 1)), rewards, values, nv, terminated | truncated, 0.95)
    gamma = 0.95
    r = rewards[:, 0]

    def n_step(s, end, bootstrap):
        return sum(gamma ** (t - s) * r[t] for t in range(s, end + 1)) + \
            gamma ** (end + 1 - s) * bootstrap

    for s in range(T):
        if s <= 4:
            want = n_step(s, 4, 0.0)
        elif s <= 8:
            want = n_step(s, 8, trunc_value)
        else:
            want = n_step(s, T - 1, last[0])
        assert vs[s, 0] == pytest.approx(want, rel=1e-9)


def test_impact_loss_matches_a_naive_per_sample_computation():
    torch.manual_seed(0)
    from gymnasium import spaces

    from dask_rl.config.schema import ModelConfig
    from dask_rl.models import make_model

    model = make_model(spaces.Box(-1, 1, (3,)), spaces.Discrete(3), ModelConfig(), seed=0)
    B = 32
    obs = torch.randn(B, 3)
    actions = torch.randint(0, 3, (B,))
    mb = {"obs": obs, "actions": actions,
          "logp": torch.log(torch.rand(B) * 0.8 + 0.1),
          "target_logp": torch.log(torch.rand(B) * 0.8 + 0.1),
          "advantages": torch.randn(B), "returns": torch.randn(B), "values": torch.randn(B)}
    cfg = IMPACTConfig(norm_adv=False, ent_coef=0.0, vf_coef=0.0, clip_coef=0.3,
                       target_is_clip=2.0)
    total, stats = IMPACT(cfg).loss(model, Batch(**mb))
    with torch.no_grad():
        dist = model.policy(obs)
        new = dist.log_prob(actions)
    want = []
    for k in range(B):
        w = min(np.exp(mb["target_logp"][k].item() - mb["logp"][k].item()), 2.0)
        r = w * np.exp(new[k].item() - mb["target_logp"][k].item())
        a = mb["advantages"][k].item()
        want.append(-min(a * r, a * np.clip(r, 0.7, 1.3)))
    assert total.item() == pytest.approx(np.mean(want), rel=1e-5)
    assert stats["losses/policy_loss"] == pytest.approx(np.mean(want), rel=1e-5)
