"""PPO's pieces against naive per-element reference loops."""

import numpy as np
import pytest
import torch

from dask_rl.algos import ppo


def naive_gae(rewards, values, last_value, terminated, truncated, trunc_values, gamma, lam):
    """Textbook GAE, one env and one step at a time, with explicit episode bookkeeping."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                next_v, cont = 0.0, 0.0
            elif truncated[t, n]:
                next_v, cont = trunc_values[(t, n)], 0.0
            else:
                next_v = values[t + 1, n] if t + 1 < T else last_value[n]
                cont = 1.0
            delta = rewards[t, n] + gamma * next_v - values[t, n]
            running = delta + gamma * lam * cont * running
            adv[t, n] = running
    return adv


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_naive_loop(seed):
    rng = np.random.default_rng(seed)
    T, N = 37, 5
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    last_value = rng.normal(size=N).astype(np.float32)
    terminated = rng.random((T, N)) < 0.05
    truncated = (rng.random((T, N)) < 0.05) & ~terminated
    idx = np.argwhere(truncated).astype(np.int32)
    tv = rng.normal(size=len(idx)).astype(np.float32)
    nv = ppo.next_values(values, last_value, terminated, truncated, idx, tv)
    got = ppo.gae(rewards, values, nv, terminated | truncated, 0.99, 0.95)
    want = naive_gae(rewards, values, last_value, terminated, truncated,
                     {tuple(i): v for i, v in zip(idx.tolist(), tv)}, 0.99, 0.95)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_is_discounted_return_minus_value():
    rewards = np.ones((4, 1), np.float32)
    values = np.zeros((4, 1), np.float32)
    nv = ppo.next_values(values, np.zeros(1, np.float32), np.zeros((4, 1), bool),
                         np.zeros((4, 1), bool), np.zeros((0, 2), np.int32), np.zeros(0))
    adv = ppo.gae(rewards, values, nv, np.zeros((4, 1), bool), 0.5, 1.0)
    np.testing.assert_allclose(adv[:, 0], [1 + 0.5 + 0.25 + 0.125, 1.75, 1.5, 1.0])


def test_clipped_surrogate_matches_naive():
    rng = np.random.default_rng(0)
    ratio = torch.tensor(rng.uniform(0.5, 1.5, 200))
    adv = torch.tensor(rng.normal(size=200))
    eps = 0.2
    want = np.mean([-min(r * a, np.clip(r, 1 - eps, 1 + eps) * a)
                    for r, a in zip(ratio.numpy(), adv.numpy())])
    got = ppo.clipped_surrogate(ratio.log(), adv, eps).item()
    assert got == pytest.approx(want, rel=1e-9)


def test_value_loss_matches_naive():
    rng = np.random.default_rng(1)
    new, old, ret = (torch.tensor(rng.normal(size=100)) for _ in range(3))
    eps = 0.2
    want = np.mean([0.5 * max((n - r) ** 2, (o + np.clip(n - o, -eps, eps) - r) ** 2)
                    for n, o, r in zip(new.numpy(), old.numpy(), ret.numpy())])
    assert ppo.value_loss(new, old, ret, eps).item() == pytest.approx(want, rel=1e-9)
    unclipped = np.mean([0.5 * (n - r) ** 2 for n, r in zip(new.numpy(), ret.numpy())])
    assert ppo.value_loss(new, old, ret, None).item() == pytest.approx(unclipped, rel=1e-9)


def test_normalize():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = ppo.normalize(x)
    assert y.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert y.std().item() == pytest.approx(1.0, abs=1e-5)
    assert ppo.normalize(torch.tensor([5.0])).item() == 0.0


def test_entropy_and_grad_norm_clipping_match_naive():
    # Entropy of the categorical head, and the global-norm clipping the learner applies.
    from dask_rl.models.actor_critic import CategoricalDist

    logits = torch.tensor([[0.1, 2.0, -1.0], [0.0, 0.0, 0.0]])
    p = torch.softmax(logits, -1).numpy()
    want = [-sum(pi * np.log(pi) for pi in row) for row in p]
    np.testing.assert_allclose(CategoricalDist(logits).entropy().numpy(), want, rtol=1e-6)

    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    params[0].grad = torch.tensor([3.0, 0.0, 4.0])
    params[1].grad = torch.tensor([0.0, 12.0])
    total = np.sqrt(9 + 16 + 144)  # 13
    torch.nn.utils.clip_grad_norm_(params, 6.5)
    np.testing.assert_allclose(params[0].grad.numpy(), np.array([3.0, 0.0, 4.0]) * 6.5 / total,
                               rtol=1e-5)


def test_learners_measure_other_policies_against_the_algorithms_own_denominator():
    """min_i pi_i(a|s) / D(a|s) sample by sample: D is mu for PPO, and IMPACT's
    mu / min(mu / pi_target, rho) when the batch says so (``ratio_logp``)."""
    from torch.distributions import Categorical

    from dask_rl.algos.base import Batch
    from dask_rl.config import from_dict
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model, set_flat
    from dask_rl.roles.learner import Learner

    cfg = from_dict({})
    spaces = env_spaces(cfg.env)
    others = [get_flat(make_model(*spaces, cfg.model, seed=10 + v)) for v in range(3)]
    learner = Learner(cfg, *spaces, device="cpu")
    rng = np.random.default_rng(0)
    obs = torch.tensor(rng.normal(size=(40, 4)), dtype=torch.float32)
    actions = torch.tensor(rng.integers(0, 2, 40))
    mu = rng.uniform(0.2, 0.8, 40)
    denominator = rng.uniform(0.2, 0.8, 40)
    zeros = torch.zeros(40)
    for ratio_logp, d in ((None, mu), (torch.tensor(np.log(denominator)), denominator)):
        batch = Batch(obs=obs, actions=actions, logp=torch.tensor(np.log(mu)),
                      advantages=zeros, returns=zeros, values=zeros, ratio_logp=ratio_logp)
        got = learner._cross_ratio_min(batch, others)
        want = []
        for k in range(40):
            ratios = []
            for flat in others:
                model = make_model(*spaces, cfg.model)
                set_flat(model, flat)
                logits = model.pi_head(model.pi_body(obs[k:k + 1]))
                pi = Categorical(logits=logits).log_prob(actions[k:k + 1]).exp().item()
                ratios.append(pi / d[k])
            want.append(min(ratios))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
