"""Losses and gradients against the papers' formulas, written out per sample in numpy.

Nothing here calls the code under test to compute an expected value or copies its
expression: each reference is the paper's equation for one sample, looped in plain Python,
on a model whose per-sample logits and values are parameters (so probabilities are known).
"""

import numpy as np
import pytest
import torch
from torch import nn

from dask_rl.algos.base import Batch
from dask_rl.algos.impact import IMPACT, IMPACTConfig
from dask_rl.algos.ppo import PPO, PPOConfig
from dask_rl.models.actor_critic import CategoricalDist
from dask_rl.staleness.truncation import GlobalTruncation

B, K = 24, 3  # samples, actions


class TableModel(nn.Module):
    """Per-sample logits and values as parameters: ``model(idx)`` -> (dist, value)."""

    def __init__(self, logits: np.ndarray, values: np.ndarray):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits, dtype=torch.float64))
        self.v = nn.Parameter(torch.tensor(values, dtype=torch.float64))

    def forward(self, idx):
        return CategoricalDist(self.logits[idx]), self.v[idx]

    def policy(self, idx):
        return CategoricalDist(self.logits[idx])


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _setup(seed, *, spread=0.6):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1, (B, K))
    actions = rng.integers(0, K, B)
    pi = _softmax(logits)[np.arange(B), actions]
    # behaviour and target probabilities around pi, so that some ratios clip and some do not
    mu = np.clip(pi * np.exp(rng.normal(0, spread, B)), 1e-3, 0.999)
    tgt = np.clip(pi * np.exp(rng.normal(0, spread, B)), 1e-3, 0.999)
    adv = rng.normal(0, 1, B)
    values = rng.normal(0, 1, B)
    old_values = values + rng.normal(0, 0.3, B)
    returns = rng.normal(0, 1, B)
    return dict(logits=logits, actions=actions, pi=pi, mu=mu, tgt=tgt, adv=adv,
                values=values, old_values=old_values, returns=returns)


def _batch(d, **extra):
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return Batch(obs=torch.arange(B), actions=torch.tensor(d["actions"]), logp=t(np.log(d["mu"])),
                 advantages=t(d["adv"]), returns=t(d["returns"]), values=t(d["old_values"]),
                 **extra)


def _entropy(logits):
    p = _softmax(logits)
    return float(np.mean([-sum(pk * np.log(pk) for pk in row) for row in p]))


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


# ---- PPO (Schulman et al. 2017, Eq. 7 and 9) -------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_ppo_loss_is_the_papers_clipped_objective_per_sample(seed):
    d = _setup(seed)
    eps, c_vf, c_ent = 0.2, 0.5, 0.01
    cfg = PPOConfig(clip_coef=eps, vf_coef=c_vf, ent_coef=c_ent, norm_adv=False)
    model = TableModel(d["logits"], d["values"])
    total, stats = PPO(cfg).loss(model, _batch(d))
    pg, vf = [], []
    for k in range(B):
        r = d["pi"][k] / d["mu"][k]
        a = d["adv"][k]
        pg.append(-min(r * a, _clip(r, 1 - eps, 1 + eps) * a))
        v, v_old, ret = d["values"][k], d["old_values"][k], d["returns"][k]
        v_clipped = v_old + _clip(v - v_old, -eps, eps)
        vf.append(0.5 * max((v - ret) ** 2, (v_clipped - ret) ** 2))
    want = np.mean(pg) - c_ent * _entropy(d["logits"]) + c_vf * np.mean(vf)
    assert stats["losses/policy_loss"] == pytest.approx(np.mean(pg), rel=1e-9)
    assert stats["losses/value_loss"] == pytest.approx(np.mean(vf), rel=1e-9)
    assert total.item() == pytest.approx(want, rel=1e-9)


def test_ppo_default_normalises_advantages_per_minibatch_before_the_objective():
    """The default ``norm_adv=True`` (CleanRL's deviation from Eq. 7): each minibatch's
    advantages become (A - mean) / (sample std + 1e-8) before the clipped objective; written
    out per sample, the mean and the n - 1 standard deviation by hand."""
    d = _setup(11)
    d["adv"] = d["adv"] * 3.0 + 2.0                 # far from zero mean, unit scale
    eps = 0.2
    cfg = PPOConfig(clip_coef=eps, vf_coef=0.0, ent_coef=0.0)
    assert cfg.norm_adv
    model = TableModel(d["logits"], d["values"])
    _, stats = PPO(cfg).loss(model, _batch(d))
    mean = sum(d["adv"]) / B
    std = (sum((a - mean) ** 2 for a in d["adv"]) / (B - 1)) ** 0.5
    pg = []
    for k in range(B):
        r = d["pi"][k] / d["mu"][k]
        a = (d["adv"][k] - mean) / (std + 1e-8)
        pg.append(-min(r * a, _clip(r, 1 - eps, 1 + eps) * a))
    assert stats["losses/policy_loss"] == pytest.approx(np.mean(pg), rel=1e-9)
    raw = np.mean([-min(d["pi"][k] / d["mu"][k] * d["adv"][k],
                        _clip(d["pi"][k] / d["mu"][k], 1 - eps, 1 + eps) * d["adv"][k])
                   for k in range(B)])
    assert abs(stats["losses/policy_loss"] - raw) > 0.1   # the normalisation mattered


# ---- IMPACT (Luo et al. 2020, Sec. 3.1) ----------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_impact_clips_the_ratio_to_the_target_network(seed):
    """r = min(mu/pi_target, rho) * pi_theta/mu; objective min(r A, clip(r, 1-eps, 1+eps) A).

    While mu/pi_target <= rho, r is pi_theta/pi_target: the trust region is around the target
    network, not around the (stale) behaviour policy.
    """
    d = _setup(seed, spread=0.4)
    eps, rho = 0.3, 2.0
    cfg = IMPACTConfig(clip_coef=eps, target_is_clip=rho, vf_coef=0.0, ent_coef=0.0,
                       norm_adv=False)
    model = TableModel(d["logits"], d["values"])
    batch = _batch(d, target_logp=torch.tensor(np.log(d["tgt"]), dtype=torch.float64))
    total, _ = IMPACT(cfg).loss(model, batch)
    want = []
    for k in range(B):
        r = min(d["mu"][k] / d["tgt"][k], rho) * d["pi"][k] / d["mu"][k]
        a = d["adv"][k]
        want.append(-min(r * a, _clip(r, 1 - eps, 1 + eps) * a))
    assert total.item() == pytest.approx(np.mean(want), rel=1e-9)


def test_impact_trust_region_ignores_how_stale_the_behaviour_policy_is():
    """pi_theta == pi_target: every sample is inside the trust region, however far mu is."""
    d = _setup(5, spread=1.5)
    d["tgt"] = d["pi"]
    cfg = IMPACTConfig(clip_coef=0.2, target_is_clip=1e6, vf_coef=0.0, ent_coef=0.0,
                       norm_adv=False)
    model = TableModel(d["logits"], d["values"])
    batch = _batch(d, target_logp=torch.tensor(np.log(d["tgt"]), dtype=torch.float64))
    _, stats = IMPACT(cfg).loss(model, batch)
    assert stats["losses/clipfrac"] == 0.0
    assert stats["losses/policy_loss"] == pytest.approx(-np.mean(d["adv"]), rel=1e-9)


# ---- Stellaris' global IS truncation (Yu et al., SC'24, Sec. 4.1) --------------------------

def _truncation_reference(d, others, rho, eps, denominator=None):
    """Per sample: R' = min(|min_i pi_i/mu|, rho) over all learners (this one included) is the
    importance weight of the sample's policy gradient, inside PPO's trust region."""
    loss, weights = [], []
    den = d["mu"] if denominator is None else denominator
    for k in range(B):
        r = d["pi"][k] / den[k]
        ratios = [r] + [o[k] / den[k] for o in others]
        weight = min(abs(min(ratios)), rho)
        a = d["adv"][k]
        clipped = _clip(r, 1 - eps, 1 + eps) * a < r * a  # PPO's min picks the clipped term
        loss.append(-(_clip(r, 1 - eps, 1 + eps) * a if clipped else weight * a))
        weights.append(0.0 if clipped else weight)
    return np.mean(loss), np.array(weights)


@pytest.mark.parametrize("seed, rho", [(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.5)])
def test_is_truncation_weights_each_samples_gradient_by_r_prime(seed, rho):
    d = _setup(seed)
    rng = np.random.default_rng(100 + seed)
    others = [np.clip(d["pi"] * np.exp(rng.normal(0, 0.5, B)), 1e-3, 0.999) for _ in range(2)]
    eps = 0.2
    cfg = PPOConfig(clip_coef=eps, vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    model = TableModel(d["logits"], d["values"])
    cross = torch.tensor(np.min([o / d["mu"] for o in others], axis=0), dtype=torch.float64)
    total, _ = PPO(cfg).loss(model, _batch(d, cross_ratio_min=cross),
                             sample_weight=GlobalTruncation(rho))
    want, weights = _truncation_reference(d, others, rho, eps)
    assert total.item() == pytest.approx(want, rel=1e-9)
    assert (weights <= np.minimum(rho, d["pi"] / d["mu"]) + 1e-12).all()
    # d loss / d log pi(a_k|s_k) = -R'_k A_k / B where the unclipped term is active, else 0
    total.backward()
    p = _softmax(d["logits"])
    for k in range(B):
        onehot = np.eye(K)[d["actions"][k]]
        dlogp = onehot - p[k]  # d log pi(a|s) / d logits
        want_grad = -weights[k] * d["adv"][k] / B * dlogp
        np.testing.assert_allclose(model.logits.grad[k].numpy(), want_grad, atol=1e-12)


@pytest.mark.parametrize("seed, rho", [(4, 1.0), (5, 1.1), (6, 1.5)])
def test_a_learner_alone_truncates_its_own_ratio(seed, rho):
    """No other learner active: the paper's minimum is over this learner's policy alone,
    ``R' = min(|r|, rho)`` — the cap still holds (it was once dropped: plain PPO)."""
    d = _setup(seed)
    eps = 0.2
    cfg = PPOConfig(clip_coef=eps, vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    model = TableModel(d["logits"], d["values"])
    total, _ = PPO(cfg).loss(model, _batch(d, cross_ratio_min=None),
                             sample_weight=GlobalTruncation(rho))
    want, weights = _truncation_reference(d, [], rho, eps)
    assert total.item() == pytest.approx(want, rel=1e-9)
    total.backward()
    p = _softmax(d["logits"])
    for k in range(B):
        dlogp = np.eye(K)[d["actions"][k]] - p[k]
        np.testing.assert_allclose(model.logits.grad[k].numpy(),
                                   -weights[k] * d["adv"][k] / B * dlogp, atol=1e-12)
    # the case matters: some sample's ratio is above the cap where PPO would weight it by r
    r = d["pi"] / d["mu"]
    assert ((r > rho) & (weights > 0)).any()


def test_a_bad_action_above_the_cap_is_still_pushed_down():
    """Negative advantage, ratio above every cap: the gradient must lower its probability."""
    logits = np.array([[2.0, 0.0, 0.0]])
    model = TableModel(logits, np.zeros(1))
    pi = _softmax(logits)[0, 0]
    mu = pi / 1.5          # r = 1.5: the learner made the bad action likelier
    other = pi / 3.0       # another learner: ratio 0.33, so the cap is well below r
    batch = Batch(obs=torch.arange(1), actions=torch.tensor([0]),
                  logp=torch.tensor([np.log(mu)], dtype=torch.float64),
                  advantages=torch.tensor([-1.0], dtype=torch.float64),
                  returns=torch.zeros(1, dtype=torch.float64),
                  values=torch.zeros(1, dtype=torch.float64),
                  cross_ratio_min=torch.tensor([other / mu], dtype=torch.float64))
    cfg = PPOConfig(clip_coef=0.2, vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    loss, _ = PPO(cfg).loss(model, batch, sample_weight=GlobalTruncation(1.0))
    loss.backward()
    grad = model.logits.grad[0].numpy()
    assert grad[0] > 0  # descent lowers the logit of the bad action...
    step = logits - 0.1 * grad
    assert _softmax(step)[0, 0] < pi  # ...and with it its probability


def test_an_extreme_ratio_gives_a_finite_gradient_with_truncation_on():
    """log r = -120 underflows r to 0 in float32: the weighted surrogate must not divide by it."""
    logits = torch.tensor([[60.0, -60.0]], requires_grad=True)
    dist = CategoricalDist(logits)
    logp = dist.log_prob(torch.tensor([1]))                 # about -120
    from dask_rl.algos.ppo import clipped_surrogate
    from dask_rl.staleness.truncation import truncation_weight

    logratio = logp - torch.tensor([0.0])
    ratio = logratio.exp()
    weight = truncation_weight(ratio, torch.tensor([0.5]), 1.0)
    loss = clipped_surrogate(logratio, torch.tensor([-1.0]), 0.2, weight)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("seed", range(3))
def test_impact_full_loss_with_truncation_per_sample(seed):
    """Value loss 0.5 (V - v_s)^2, entropy bonus and R' against IMPACT's own denominator."""
    d = _setup(seed, spread=0.8)
    eps, rho, c_vf, c_ent, is_rho = 0.3, 2.0, 0.5, 0.01, 1.0
    cfg = IMPACTConfig(clip_coef=eps, target_is_clip=rho, vf_coef=c_vf, ent_coef=c_ent,
                       norm_adv=False)
    den = np.array([d["mu"][k] / min(d["mu"][k] / d["tgt"][k], rho) for k in range(B)])
    assert any(d["mu"][k] / d["tgt"][k] > rho for k in range(B)), "the truncated branch"
    rng = np.random.default_rng(200 + seed)
    others = [np.clip(d["pi"] * np.exp(rng.normal(0, 0.5, B)), 1e-3, 0.999) for _ in range(2)]
    cross = torch.tensor(np.min([o / den for o in others], axis=0), dtype=torch.float64)
    model = TableModel(d["logits"], d["values"])
    batch = _batch(d, target_logp=torch.tensor(np.log(d["tgt"]), dtype=torch.float64),
                   cross_ratio_min=cross)
    total, stats = IMPACT(cfg).loss(model, batch, sample_weight=GlobalTruncation(is_rho))
    pg, _ = _truncation_reference(d, others, is_rho, eps, denominator=den)
    vf = np.mean([0.5 * (d["values"][k] - d["returns"][k]) ** 2 for k in range(B)])
    want = pg - c_ent * _entropy(d["logits"]) + c_vf * vf
    assert stats["losses/value_loss"] == pytest.approx(vf, rel=1e-9)
    assert total.item() == pytest.approx(want, rel=1e-9)
