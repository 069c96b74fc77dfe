"""The flat-vector optimizers agree with torch.optim, on numpy arrays and on tensors."""

import numpy as np
import pytest
import torch

from dask_rl.algos.optim import SGD, Adam, make_optimizer
from dask_rl.roles.learner import clip_grad_norm


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_adam_matches_torch(backend):
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=7).astype(np.float32)
    grads = [rng.normal(size=7).astype(np.float32) for _ in range(5)]
    ref = torch.nn.Parameter(torch.tensor(x0))
    opt = torch.optim.Adam([ref], lr=0.01, eps=1e-5)
    x = x0.copy() if backend == "numpy" else torch.tensor(x0)
    mine = Adam(x, eps=1e-5)
    for g in grads:
        ref.grad = torch.tensor(g)
        opt.step()
        mine.step(x, g if backend == "numpy" else torch.tensor(g), 0.01)
    np.testing.assert_allclose(np.asarray(x), ref.detach().numpy(), rtol=1e-5, atol=1e-7)
    assert mine.t == 5


def test_sgd_and_momentum():
    x = np.ones(3, np.float32)
    SGD(x).step(x, np.array([1, 2, 3], np.float32), 0.5)
    np.testing.assert_allclose(x, [0.5, 0.0, -0.5])
    opt = SGD(np.zeros(1), momentum=0.9)
    y = np.zeros(1)
    opt.step(y, np.ones(1), 1.0)
    opt.step(y, np.ones(1), 1.0)
    np.testing.assert_allclose(y, [-(1 + 1.9)])
    assert x.dtype == np.float32


@pytest.mark.parametrize("make", [lambda x: SGD(x), lambda x: SGD(x, momentum=0.9),
                                  lambda x: Adam(x, eps=1e-5)], ids=["sgd", "momentum", "adam"])
def test_a_stepped_copy_is_the_in_place_step_and_leaves_the_input(make):
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=9).astype(np.float32)
    grads = [rng.normal(size=9).astype(np.float32) for _ in range(3)]
    in_place, fresh = make(np.zeros(9, np.float32)), make(np.zeros(9, np.float32))
    x, y = x0.copy(), x0.copy()
    for g in grads:
        in_place.step(x, g, 0.3)
        given, kept = y, y.copy()
        y = fresh.stepped(given, g, 0.3)
        assert y is not given
        np.testing.assert_array_equal(given, kept)  # the input array is left as it was
    np.testing.assert_array_equal(x, y)  # the same numbers, bit for bit
    assert y.dtype == np.float32 and fresh.t == in_place.t == 3


def test_state_roundtrip():
    x = np.zeros(4, np.float32)
    a = make_optimizer("adam", x)
    a.step(x, np.ones(4, np.float32), 0.1)
    b = make_optimizer("adam", np.zeros(4, np.float32))
    b.load_state_dict(a.state_dict())
    y, z = x.copy(), x.copy()
    a.step(y, np.ones(4, np.float32), 0.1)
    b.step(z, np.ones(4, np.float32), 0.1)
    np.testing.assert_array_equal(y, z)
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("lion", x)


def test_clip_grad_norm_matches_torch():
    g = torch.tensor([3.0, 0.0, 4.0, 12.0])
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([p], 6.5)
    assert clip_grad_norm(g, 6.5) == pytest.approx(13.0)
    torch.testing.assert_close(g, p.grad)
    small = torch.tensor([0.1, 0.2])
    clip_grad_norm(small, 6.5)
    torch.testing.assert_close(small, torch.tensor([0.1, 0.2]))
