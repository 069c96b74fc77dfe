"""An algorithm added from outside the package trains through the normal runtime.

``reinforce_toy.py`` (beside this file) is one module of ~60 lines and a ``register`` call;
no file of dask-rl knows it. The pipeline names it, the loader validates its section, the
learners on worker processes build it from the config, and CartPole improves.
"""

import importlib

import pytest

import dask_rl
from dask_rl.algos import registry
from dask_rl.config import ConfigError, from_dict


@pytest.fixture
def reinforce():
    """The toy's registration (its module registers itself on import), undone afterwards."""
    module = importlib.import_module("reinforce_toy")
    registry.register(module.Reinforce)
    yield module
    registry.unregister("reinforce")
    assert "reinforce" not in registry.names()


def test_a_registered_algorithm_is_validated_like_a_built_in_one(reinforce):
    cfg = from_dict({"algo": {"name": "reinforce", "gamma": 0.98}})
    assert type(cfg.algo).__name__ == "ReinforceConfig" and cfg.algo.gamma == 0.98
    assert "reinforce" in registry.names()
    with pytest.raises(ConfigError, match="algo.clip_coef: unknown key"):
        from_dict({"algo": {"name": "reinforce", "clip_coef": 0.2}})


def test_an_algorithm_that_weights_no_samples_is_refused_stellaris_truncation(reinforce):
    """The toy's loss takes no ``sample_weight``: ``learner.is_truncation`` is one line at
    load time, while PPO, whose loss takes it, is accepted."""
    with pytest.raises(ConfigError, match=r"^learner.is_truncation: algorithm 'reinforce' "
                                          r"takes no per-sample weight"):
        from_dict({"algo": {"name": "reinforce"}, "learner": {"is_truncation": True}})
    with pytest.raises(ConfigError, match="learner.is_truncation: algorithm 'dqn'"):
        from_dict({"algo": {"name": "dqn"}, "learner": {"is_truncation": True}})
    assert from_dict({"algo": {"name": "ppo"},
                      "learner": {"is_truncation": True}}).learner.is_truncation


@pytest.mark.slow
def test_a_toy_reinforce_trains_cartpole_on_worker_processes(reinforce, local_client, tmp_path):
    result = dask_rl.train(
        {"algo": {"name": "reinforce"}, "seed": 3,
         "env": {"num_envs": 4}, "rollout": {"steps": 128},
         "learner": {"max_learners": 2, "lr": 2e-3, "epochs": 1, "minibatches": 1,
                     "anneal_lr": False},
         "stop": {"env_steps": 200_000, "eval_every_updates": 25,
                  "eval_episodes": 10},
         "checkpoint": {"every_s": 0}},
        client=local_client, run_dir=tmp_path / "reinforce")
    s = result.summary
    assert s["algorithm"] == "reinforce" and s["updates"] > 0
    assert s["gradients_rejected"] == 0
    # an untrained policy scores ~20; the greedy policy reaches CartPole's threshold
    assert s["best_return"] >= 475, s
