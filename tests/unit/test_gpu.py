"""A learner runs its math on CUDA where a GPU is visible (skipped elsewhere)."""

import numpy as np
import pytest
import torch

from dask_rl.config import from_dict
from dask_rl.data import PolicySnapshot
from dask_rl.envs import env_spaces
from dask_rl.models import get_flat, make_model, resolve_device
from dask_rl.roles.collector import Collector
from dask_rl.roles.learner import Learner


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(RuntimeError, match="no CUDA device"):
            resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_learner_update_runs_on_cuda():
    cfg = from_dict({"learner": {"device": "cuda"}})
    spaces = env_spaces(cfg.env)
    snap = PolicySnapshot(0, get_flat(make_model(*spaces, cfg.model, seed=0)))
    rw = Collector(cfg, seed=0)
    rw.load(snap)
    traj = rw.collect(64)
    learner = Learner(cfg, *spaces)
    assert learner.flat.is_cuda and next(learner.model.parameters()).is_cuda
    res = learner.update(snap, traj, lr=3e-4, seed=0)
    cpu = Learner(cfg, *spaces, device="cpu").update(snap, traj, lr=3e-4, seed=0)
    assert np.isfinite(res.delta).all()
    np.testing.assert_allclose(res.delta, cpu.delta, rtol=1e-3, atol=1e-5)
