"""Evolution strategies: noise table, antithetic sampling, rank shaping, the update."""

import numpy as np
import pytest

from dask_rl.algos import es
from dask_rl.algos.optim import Adam


def test_noise_table_is_deterministic_float32():
    a, b = es.noise_table(3, 1000), es.noise_table(3, 1000)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32
    assert not np.array_equal(a, es.noise_table(4, 1000))
    assert abs(a.mean()) < 0.1 and abs(a.std() - 1) < 0.1


def test_ask_stays_inside_the_table():
    rng = np.random.default_rng(0)
    idx = es.ask(rng, table_size=100, dim=10, pairs=1000)
    assert idx.min() >= 0 and idx.max() <= 90
    with pytest.raises(ValueError, match="smaller than the policy"):
        es.ask(rng, table_size=5, dim=10, pairs=1)


def test_centered_ranks_match_a_naive_definition():
    x = np.array([[3.0, -1.0], [10.0, 0.5], [7.0, 2.0]])
    flat = x.ravel()
    order = sorted(range(flat.size), key=lambda i: (flat[i], i))
    want = np.empty(flat.size)
    for rank, i in enumerate(order):
        want[i] = rank / (flat.size - 1) - 0.5
    np.testing.assert_allclose(es.centered_ranks(x), want.reshape(x.shape))
    assert es.centered_ranks(x).min() == -0.5 and es.centered_ranks(x).max() == 0.5


def test_gradient_matches_a_naive_sum():
    rng = np.random.default_rng(1)
    table = es.noise_table(0, 500)
    dim, n = 7, 6
    idx = es.ask(rng, table_size=len(table), dim=dim, pairs=n)
    returns = rng.normal(size=(n, 2))
    ranks = es.centered_ranks(returns)
    want = sum((ranks[i, 0] - ranks[i, 1]) * table[idx[i]:idx[i] + dim] for i in range(n))
    want = want / (2 * n)
    np.testing.assert_allclose(es.gradient(returns, idx, table, dim), want, rtol=1e-5)


def _quadratic(p):
    return -np.sum((p - 3.0) ** 2, axis=-1)


def test_es_climbs_a_quadratic():
    """ask/tell with Adam finds the optimum of -|theta - 3|^2."""
    rng = np.random.default_rng(0)
    table = es.noise_table(0, 100_000)
    dim, sigma = 5, 0.1
    theta = np.zeros(dim, np.float32)
    opt = Adam(theta)
    for _ in range(300):
        idx = es.ask(rng, table_size=len(table), dim=dim, pairs=20)
        eps = np.stack([es.perturbation(table, i, dim) for i in idx])
        returns = np.stack([_quadratic(theta + sigma * eps), _quadratic(theta - sigma * eps)],
                           axis=1)
        g = es.gradient(returns, idx, table, dim)
        opt.step(theta, es.descent_direction(g, theta, 0.0), 0.05)
    np.testing.assert_allclose(theta, 3.0, atol=0.15)
