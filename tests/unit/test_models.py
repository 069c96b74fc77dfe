import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal

from dask_rl.config import ModelConfig
from dask_rl.models import get_flat, make_model, num_parameters, set_flat
from dask_rl.models.actor_critic import CategoricalDist, DiagGaussianDist
from dask_rl.models.normalizer import batch_moments, mean_var, merge_moments


def test_flat_roundtrip_and_seeded_init():
    obs, act = spaces.Box(-1, 1, (4,)), spaces.Discrete(2)
    a = make_model(obs, act, ModelConfig(), seed=3)
    b = make_model(obs, act, ModelConfig(), seed=3)
    c = make_model(obs, act, ModelConfig(), seed=4)
    np.testing.assert_array_equal(get_flat(a), get_flat(b))
    assert not np.array_equal(get_flat(a), get_flat(c))
    set_flat(c, get_flat(a))
    np.testing.assert_array_equal(get_flat(a), get_flat(c))
    assert len(get_flat(a)) == num_parameters(a)
    with pytest.raises(ValueError, match="flat vector has 3 values"):
        set_flat(a, np.zeros(3, np.float32))


def test_lean_distributions_match_torch():
    logits = torch.randn(6, 4)
    acts = torch.randint(0, 4, (6,))
    ref = Categorical(logits=logits)
    d = CategoricalDist(logits)
    torch.testing.assert_close(d.log_prob(acts), ref.log_prob(acts))
    torch.testing.assert_close(d.entropy(), ref.entropy())
    mean, log_std = torch.randn(6, 3), torch.randn(3)
    a = torch.randn(6, 3)
    refn = Normal(mean, log_std.exp())
    g = DiagGaussianDist(mean, log_std)
    torch.testing.assert_close(g.log_prob(a), refn.log_prob(a).sum(-1))
    torch.testing.assert_close(g.entropy(), refn.entropy().sum(-1))


def test_sampling_is_reproducible_with_a_generator():
    obs, act = spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,))
    m = make_model(obs, act, ModelConfig(), seed=0)
    x = torch.randn(5, 3)
    a1, _ = m.act(x, generator=torch.Generator().manual_seed(1))
    a2, _ = m.act(x, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a1, a2)


def test_nature_cnn_for_frames():
    m = make_model(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), ModelConfig())
    a, lp = m.act(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert a.shape == (2,) and lp.shape == (2,)
    assert m.value(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2,)


def test_moments_merge_like_one_batch():
    rng = np.random.default_rng(0)
    x, y = rng.normal(3, 2, (50, 4)), rng.normal(-1, 5, (70, 4))
    merged = merge_moments(batch_moments(x), batch_moments(y))
    mean, var = mean_var(merged)
    both = np.concatenate([x, y])
    np.testing.assert_allclose(mean, both.mean(0))
    np.testing.assert_allclose(var, both.var(0))
