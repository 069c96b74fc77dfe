"""Your own environment: entry points, ``module:id``, spaces, and what is refused (no cluster).

The environments live in ``tests/assets/toyenvs``, a package registered nowhere and not
installed: each test puts it on ``sys.path`` itself.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from dask_rl.config import ConfigError, from_dict, to_dict
from dask_rl.envs import check_env, make_env, make_vector_env, solved_episodes

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"


@pytest.fixture(autouse=True)
def toyenvs(monkeypatch):
    monkeypatch.syspath_prepend(str(ASSETS))


def _env(**env):
    return from_dict({"env": env}, check_env=False).env


@pytest.mark.parametrize("env", [
    {"entry_point": "toyenvs.corridor:make_corridor"},
    {"entry_point": "toyenvs.corridor:Corridor", "kwargs": {"length": 4}},
    {"id": "toyenvs.registered:Corridor-v0"},
    {"entry_point": "toyenvs.corridor:DictCorridor"},
])
def test_your_environment_is_made_reset_and_stepped(env):
    cfg = _env(**env)
    assert check_env(cfg) is None
    vec = make_vector_env(cfg, 2, seed=0)
    obs, *_ = vec.step(vec.action_space.sample())
    assert obs.shape[0] == 2 and obs.dtype == np.float32
    vec.close()


def test_a_callable_is_an_entry_point_and_is_named_by_its_module():
    from toyenvs.corridor import Corridor

    cfg = dataclasses.replace(_env(), entry_point=Corridor)
    assert check_env(cfg) is None
    assert cfg.name == "toyenvs.corridor:Corridor"
    whole = dataclasses.replace(from_dict({}, check_env=False), env=cfg)
    assert to_dict(whole)["env"]["entry_point"] == "toyenvs.corridor:Corridor"
    # an environment without a standard is confirmed on the stated number of episodes
    assert solved_episodes(cfg) == 20


def test_dict_observations_are_flattened_and_multidiscrete_actions_kept():
    env = make_env(_env(entry_point="toyenvs.corridor:DictCorridor"))
    # Gymnasium's FlattenObservation, keys in order: Box "left" (1,), then Discrete(6) "pos"
    # one-hot; as float32
    assert env.observation_space.shape == (7,) and env.observation_space.dtype == np.float32
    assert isinstance(env.action_space, spaces.MultiDiscrete)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, [1, 1, 0, 0, 0, 0, 0])
    obs, *_ = env.step(np.array([1, 2]))
    np.testing.assert_allclose(obs, [1 - 1 / 30, 0, 1, 0, 0, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("env, reason", [
    ({"entry_point": "no_such_pkg.envs:make"}, "cannot import no_such_pkg.envs"),
    ({"entry_point": "toyenvs.corridor:nothing"}, "toyenvs.corridor has no 'nothing'"),
    ({"entry_point": "__main__:Corridor"}, "'Corridor' was defined in a script or notebook"),
    ({"entry_point": "toyenvs.corridor"}, "expected module:name"),
    ({"entry_point": "toyenvs.corridor:BrokenStep"}, "step() returned 4 values"),
    ({"id": "no_such_pkg:Thing-v0"}, "cannot import no_such_pkg"),
    ({"id": "toyenvs.corridor:Thing-v0"}, "importing toyenvs.corridor does not register"),
    ({"entry_point": "toyenvs.corridor:Corridor", "kwargs": {"colour": 1}},
     "making the environment failed (TypeError"),
])
def test_what_cannot_be_trained_is_one_line(env, reason):
    problem = check_env(_env(**env))
    assert problem is not None and reason in problem, problem
    assert "\n" not in problem


def test_value_based_algorithms_need_discrete_actions():
    cfg = _env(entry_point="toyenvs.corridor:DictCorridor")
    assert "needs Discrete actions" in check_env(cfg, discrete_actions=True)
    with pytest.raises(ConfigError, match=r"^env.entry_point: action space MultiDiscrete"):
        from_dict({"algo": {"name": "dqn"}, "env": {"entry_point":
                                                    "toyenvs.corridor:DictCorridor"}})


def test_an_id_and_an_entry_point_together_are_refused():
    with pytest.raises(ConfigError, match="give id or entry_point, not both"):
        from_dict({"env": {"id": "Pendulum-v1", "entry_point": "toyenvs.corridor:Corridor"}})


def test_multidiscrete_policy_is_independent_categoricals_per_component():
    from dask_rl.config.schema import ModelConfig
    from dask_rl.models import make_model

    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    model = make_model(obs_space, spaces.MultiDiscrete([2, 3]), ModelConfig(), seed=0)
    obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (5, 3)), dtype=torch.float32)
    dist = model.policy(obs)
    logits = model.pi_head(model.policy_features(obs)).detach().numpy()
    actions = np.array([[0, 2], [1, 0], [1, 1], [0, 0], [1, 2]])
    got = dist.log_prob(torch.as_tensor(actions)).detach().numpy()
    for b in range(5):  # log p(a) = log softmax_0[a0] + log softmax_1[a1], per sample
        first, second = logits[b, :2], logits[b, 2:]
        lp0 = first[actions[b, 0]] - np.log(np.exp(first).sum())
        lp1 = second[actions[b, 1]] - np.log(np.exp(second).sum())
        assert got[b] == pytest.approx(lp0 + lp1, abs=1e-5)
        p0, p1 = np.exp(first) / np.exp(first).sum(), np.exp(second) / np.exp(second).sum()
        entropy = -(p0 * np.log(p0)).sum() - (p1 * np.log(p1)).sum()
        assert dist.entropy()[b].item() == pytest.approx(entropy, abs=1e-5)
        assert dist.mode()[b].tolist() == [int(first.argmax()), int(second.argmax())]
    sample = dist.sample()
    assert sample.shape == (5, 2) and (sample[:, 0] < 2).all() and (sample[:, 1] < 3).all()


def test_a_bad_entry_point_exits_2_with_one_line_before_a_cluster(tmp_path):
    probe = ("import sys, runpy\n"
             "sys.argv = ['dask-rl'] + sys.argv[1:]\n"
             "try:\n"
             "    runpy.run_module('dask_rl.cli', run_name='__main__')\n"
             "finally:\n"
             "    print('DISTRIBUTED_IMPORTED' if 'distributed' in sys.modules "
             "else 'NO_CLUSTER')\n")
    pipeline = tmp_path / "mine.yaml"
    pipeline.write_text("algo: {name: ppo}\nenv: {entry_point: 'toyenvs.corridor:nothing'}\n")
    proc = subprocess.run(
        [sys.executable, "-c", probe, "train", str(pipeline), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "PYTHONPATH": os.pathsep.join([str(ASSETS), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "env.entry_point: toyenvs.corridor has no 'nothing'" in lines[0], lines[0]
    assert proc.stdout.strip().endswith("NO_CLUSTER"), proc.stdout
    assert not (tmp_path / "run").exists()


class _Float64Obs(gym.Env):
    """Declares float32, returns float64 (common; Gymnasium's checker only warns)."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3), {}

    def step(self, action):
        return np.zeros(3), 0.0, True, False, {}


class _HWCImage(_Float64Obs):
    observation_space = spaces.Box(0, 255, (64, 64, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        return np.zeros((64, 64, 3), np.uint8), {}


class _MatrixAction(_Float64Obs):
    action_space = spaces.Box(-1.0, 1.0, (2, 3), np.float32)


@pytest.mark.parametrize("env, problem", [
    (_Float64Obs, None),
    (_HWCImage, "image observations go to the Nature CNN channels first"),
    (_MatrixAction, "a Box of actions must be 1-D"),
])
def test_space_checks_accept_float64_and_refuse_what_would_fail_on_the_workers(env, problem):
    got = check_env(dataclasses.replace(_env(), entry_point=env, id=None))
    assert got == problem or (problem is not None and problem in got), got


def test_a_saved_entry_point_config_loads_again_and_its_name_is_stable():
    import functools

    from toyenvs.corridor import make_corridor

    cfg = from_dict({"env": {"entry_point": "toyenvs.corridor:make_corridor"}})
    saved = to_dict(cfg)
    assert saved["env"]["id"] is None
    assert from_dict(saved).env.name == "toyenvs.corridor:make_corridor"
    partial = dataclasses.replace(cfg.env, entry_point=functools.partial(make_corridor, length=5))
    assert partial.name == "toyenvs.corridor:make_corridor(length=5)"   # no memory address

    class Maker:
        def __call__(self):
            return make_corridor()

    assert dataclasses.replace(cfg.env, entry_point=Maker()).name.endswith("Maker()")
