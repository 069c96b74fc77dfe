"""V-trace and the IMPACT loss against naive reference loops."""

import numpy as np
import pytest
import torch

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


# The IMPACT objective itself is checked per sample against the paper in
# test_paper_references.py.


def test_off_policy_vtrace_advantages_at_episode_ends():
    """A^pg_s = rho_s (r_s + gamma * next) with next = 0 after termination, V(final obs) after
    truncation, v_{s+1} inside an episode — off-policy, per sample."""
    rng = np.random.default_rng(3)
    T, gamma = 10, 0.9
    log_rhos = rng.normal(0, 0.6, (T, 1))
    rewards = rng.normal(size=(T, 1))
    values = rng.normal(size=(T, 1))
    terminated = np.zeros((T, 1), bool)
    truncated = np.zeros((T, 1), bool)
    terminated[3, 0] = True
    truncated[6, 0] = True
    trunc_value, last = 0.8, np.array([-0.4])
    nv = next_values(values, last, terminated, truncated, np.array([[6, 0]], np.int32),
                     np.array([trunc_value]))
    vs, adv = vtrace(log_rhos, rewards, values, nv, terminated | truncated, gamma)
    rho = np.minimum(1.0, np.exp(log_rhos[:, 0]))
    # v_s per episode segment from IMPALA's explicit sum
    want_vs = np.zeros(T)
    for lo, hi, boot in ((0, 3, 0.0), (4, 6, trunc_value), (7, 9, last[0])):
        seg_vs, _ = naive_vtrace_one_env(log_rhos[lo:hi + 1, 0], rewards[lo:hi + 1, 0],
                                         values[lo:hi + 1, 0], boot, gamma, 1.0, 1.0)
        want_vs[lo:hi + 1] = seg_vs
    np.testing.assert_allclose(vs[:, 0], want_vs, atol=1e-9)
    for s in range(T):
        nxt = (0.0 if s == 3 else trunc_value if s == 6 else last[0] if s == T - 1
               else want_vs[s + 1])
        want = rho[s] * (rewards[s, 0] + gamma * nxt - values[s, 0])
        assert adv[s, 0] == pytest.approx(want, abs=1e-9), s


@pytest.mark.parametrize("lam", [0.95, 0.5])
def test_vtrace_lambda_is_the_explicit_sum_with_lambda_c(lam):
    """Remark 2: c_i = lambda min(c_bar, pi/mu) in the explicit sum; on-policy it is V +
    GAE(lambda), computed here by the textbook backward recursion."""
    rng = np.random.default_rng(4)
    T = 15
    log_rhos = rng.normal(0, 0.5, (T, 1))
    rewards = rng.normal(size=(T, 1))
    values = rng.normal(size=(T, 1))
    last = np.array([0.3])
    none = np.zeros((T, 1), bool)
    nv = next_values(values, last, none, none, np.zeros((0, 2), np.int32), np.zeros(0))
    vs, _ = vtrace(log_rhos, rewards, values, nv, none, 0.9, lam=lam)
    ratios = np.exp(log_rhos[:, 0])
    rhos, cs = np.minimum(1.0, ratios), lam * np.minimum(1.0, ratios)
    v_next = np.append(values[1:, 0], last[0])
    deltas = rhos * (rewards[:, 0] + 0.9 * v_next - values[:, 0])
    for s in range(T):
        total, coef = 0.0, 1.0
        for t in range(s, T):
            total += 0.9 ** (t - s) * coef * deltas[t]
            coef *= cs[t]
        assert vs[s, 0] == pytest.approx(values[s, 0] + total, abs=1e-9)
    # on-policy: V-trace(lambda) targets are V + GAE(lambda)
    vs_on, _ = vtrace(np.zeros((T, 1)), rewards, values, nv, none, 0.9, lam=lam)
    gae, acc = np.zeros(T), 0.0
    for t in reversed(range(T)):
        acc = rewards[t, 0] + 0.9 * v_next[t] - values[t, 0] + 0.9 * lam * acc
        gae[t] = acc
    np.testing.assert_allclose(vs_on[:, 0], values[:, 0] + gae, atol=1e-9)


class _TableCritic(torch.nn.Module):
    """``value(obs)``: a table indexed by the observation's id (``obs[:, 0]``)."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float32)

    def value(self, obs):
        return self.table[obs[:, 0].long()]


@pytest.mark.parametrize("seed", range(3))
def test_impact_prepare_gives_vtrace_targets_of_the_target_policy_per_sample(seed):
    """IMPACT.prepare's batch, per sample, against IMPALA Eq. (1) and Sec. 4.2 written out:
    rho_t = min(rho_bar, pi_target/mu), c_i = lambda min(c_bar, pi_target/mu),
    v_s = V(x_s) + sum_{t=s}^{e} gamma^{t-s} (prod_{i=s}^{t-1} c_i) rho_t
          * (r_t + gamma V'_t - V(x_t)),
    A_s = rho_s (r_s + gamma v'_{s+1} - V(x_s)), the sum stopping at the episode's end e
    (V'_t: 0 after termination, V(final obs) after truncation, V(x_{t+1}) otherwise). The
    ratios straddle 1 and rho_bar, c_bar, lambda are not 1, so a flipped log-ratio, the
    behaviour policy as the target or a lost lambda fails."""
    from dask_rl.algos.impact import IMPACT, IMPACTConfig
    from dask_rl.data import Trajectory

    rng = np.random.default_rng(seed)
    T, N, gamma, lam, rho_bar, c_bar = 6, 2, 0.9, 0.8, 1.3, 0.9
    ids = np.arange(T * N).reshape(T, N)             # x_t of env n has id ids[t, n]
    last_ids = T * N + np.arange(N)                  # x_T
    trunc_id = T * N + N                             # final obs of the truncated episode
    table = rng.normal(0, 1, T * N + N + 1)
    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    terminated[2, 0] = True
    truncated[3, 1] = True
    mu_logp = rng.normal(-1.0, 0.3, (T, N)).astype(np.float32)
    tgt_logp = (mu_logp + rng.normal(0, 0.6, (T, N))).astype(np.float32)
    rewards = rng.normal(0, 1, (T, N)).astype(np.float32)
    traj = Trajectory(obs=ids[..., None].astype(np.float32),
                      actions=np.zeros((T, N), np.int64), rewards=rewards,
                      terminated=terminated, truncated=truncated, behaviour_logp=mu_logp,
                      last_obs=last_ids[:, None].astype(np.float32),
                      trunc_index=np.array([[3, 1]], np.int32),
                      trunc_obs=np.array([[trunc_id]], np.float32), policy_version=0)
    cfg = IMPACTConfig(gamma=gamma, gae_lambda=lam, rho_bar=rho_bar, c_bar=c_bar)
    batch = IMPACT(cfg).prepare(traj, _TableCritic(table), device=torch.device("cpu"),
                                rewards=rewards, target_logp=tgt_logp)

    def V(i):
        return float(np.float32(table[i]))

    def V_next(t, n):
        if terminated[t, n]:
            return 0.0
        if truncated[t, n]:
            return V(trunc_id)
        return V(ids[t + 1, n]) if t + 1 < T else V(last_ids[n])

    for n in range(N):
        ratio = [np.exp(float(tgt_logp[t, n]) - float(mu_logp[t, n])) for t in range(T)]
        rho = [min(rho_bar, r) for r in ratio]
        c = [lam * min(c_bar, r) for r in ratio]
        delta = [rho[t] * (float(rewards[t, n]) + gamma * V_next(t, n) - V(ids[t, n]))
                 for t in range(T)]
        vs = []
        for s in range(T):
            total, coef, t = 0.0, 1.0, s
            while True:
                total += gamma ** (t - s) * coef * delta[t]
                if terminated[t, n] or truncated[t, n] or t == T - 1:
                    break
                coef *= c[t]
                t += 1
            vs.append(V(ids[s, n]) + total)
        for s in range(T):
            ends = terminated[s, n] or truncated[s, n] or s == T - 1
            v_after = V_next(s, n) if ends else vs[s + 1]
            adv = rho[s] * (float(rewards[s, n]) + gamma * v_after - V(ids[s, n]))
            k = s * N + n                              # flattened time-major
            assert batch.returns[k].item() == pytest.approx(vs[s], rel=1e-4, abs=1e-5)
            assert batch.advantages[k].item() == pytest.approx(adv, rel=1e-4, abs=1e-5)
            assert batch.values[k].item() == pytest.approx(V(ids[s, n]), abs=1e-6)
            assert batch.target_logp[k].item() == pytest.approx(float(tgt_logp[s, n]))
            assert batch.logp[k].item() == pytest.approx(float(mu_logp[s, n]))
