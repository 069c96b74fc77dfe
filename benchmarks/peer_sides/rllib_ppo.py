"""RLlib's PPO as its users run it: ``PPOConfig`` with RLlib's published tuned settings,
``algo.train()`` in a loop, on a local Ray instance limited to 2 CPUs, 2 env runners.

Settings (the ray repository, ``rllib/tuned_examples/ppo/``):

* CartPole-v1 — ``cartpole_ppo.py``: one linear 32-unit layer shared by policy and value,
  gamma 0.99, lr 3e-4, 6 epochs, value coefficient 0.01, KL loss on (train batch 4,000,
  minibatch 128: RLlib's defaults);
* Hopper — ``benchmark_ppo_mujoco.py``: 64-64 tanh shared, gamma 0.99, lambda 0.95, lr 3e-4,
  15 epochs, train batch 32 x 512, minibatch 4,096, value coefficient 0.01. Deviation: 2 env
  runners instead of 32 (2 cores here), the same train batch.

The snapshot is the learner's module (the weights the next iteration's env runners receive).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Normalized, Record, side_args  # noqa: E402

SETTINGS = {
    "CartPole": dict(
        model={"fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True},
        training=dict(gamma=0.99, lr=3e-4, num_epochs=6, vf_loss_coeff=0.01,
                      use_kl_loss=True),
        source="ray rllib/tuned_examples/ppo/cartpole_ppo.py"),
    "Hopper": dict(
        model={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh",
               "vf_share_layers": True},
        training=dict(gamma=0.99, lambda_=0.95, lr=3e-4, num_epochs=15,
                      train_batch_size_per_learner=32 * 512, minibatch_size=4096,
                      vf_loss_coeff=0.01),
        source="ray rllib/tuned_examples/ppo/benchmark_ppo_mujoco.py (2 env runners, not 32)"),
}


class Greedy(torch.nn.Module):
    """The module's action-distribution inputs: logits, or ``[mean, log_std]``."""

    def __init__(self, module, act_dim: int | None):
        super().__init__()
        self.module, self.act_dim = module, act_dim

    def forward(self, obs):
        out = self.module.forward_inference({"obs": obs})["action_dist_inputs"]
        return out if self.act_dim is None else out[..., :self.act_dim]


def main() -> int:
    args = side_args()
    rec = Record(args.out, args.spawn, args.grid)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import gymnasium as gym
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    s = SETTINGS[args.env.split("-")[0]]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (PPOConfig().environment(args.env).env_runners(num_env_runners=2)
              .rl_module(model_config=s["model"]).training(**s["training"])
              .debugging(seed=args.seed))
    algo = config.build_algo()
    space = gym.make(args.env).action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    obs_dim = gym.make(args.env).observation_space.shape[0]
    steps = 0
    while steps < args.budget and rec.now() < args.cap_s:
        result = algo.train()
        steps = int(result[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        ret = result.get(ENV_RUNNER_RESULTS, {}).get(EPISODE_RETURN_MEAN)
        rec.progress(steps, None if ret is None else float(ret))
        if rec.due(steps):
            module = copy.deepcopy(algo.learner_group._learner.module["default_policy"])
            head = Greedy(module, None if discrete else space.shape[0])
            greedy = Normalized(head) if discrete else Normalized(head, low=space.low,
                                                                   high=space.high)
            rec.snapshot(steps, greedy, torch.zeros((2, obs_dim)))
    rec.close(env_steps=steps, settings={"model": s["model"], **s["training"],
                                        "num_env_runners": 2,
                                        "train_batch_size": config.train_batch_size_per_learner,
                                        "minibatch_size": config.minibatch_size},
              settings_source=s["source"], torch_threads=torch.get_num_threads())
    algo.stop()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
