"""Sample Factory 2.1.1's APPO as its users run it: its own example entry points' settings
(``sf_examples``), through ``make_runner`` with an ``AlgoObserver`` that asks for a milestone
checkpoint each time the env steps cross the grid.

Settings (in the wheel; the repository's ``sf_examples/``):

* CartPole-v1 — ``sf_examples/train_gym_env.py``'s documented command: ``--algo=APPO
  --use_rnn=False --num_envs_per_worker=20 --policy_workers_per_policy=2 --recurrence=1
  --with_vtrace=False --batch_size=512 --reward_scale=0.1 --save_every_sec=10
  --experiment_summaries_interval=10``, with ``--num_workers=2 --device=cpu`` (2 cores);
* Hopper — ``sf_examples/mujoco`` (``mujoco_hopper``: Hopper-v4) with
  ``mujoco_params.mujoco_override_defaults``, deviation: ``--num_workers=2`` (not 8).

A milestone is written by the learner process; its wall time is the file's modification time.
After training (``--export``, not in the timed run) each milestone becomes the common
TorchScript snapshot: the actor-critic with its frozen observation normaliser, greedy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Normalized, Record, side_args, write_snapshots  # noqa: E402

CARTPOLE = ["--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20",
            "--policy_workers_per_policy=2", "--recurrence=1", "--with_vtrace=False",
            "--batch_size=512", "--reward_scale=0.1", "--save_every_sec=10",
            "--experiment_summaries_interval=10"]


def _env(env_id: str):
    """(the SF env name, its module's argument parsing, the settings' source)."""
    if env_id.startswith("CartPole"):
        from sf_examples import train_gym_env as m
        m.register_custom_components()
        return "CartPole-v1", m.parse_custom_args, CARTPOLE, "sf_examples/train_gym_env.py"
    from sf_examples.mujoco import train_mujoco as m
    m.register_mujoco_components()
    return ("mujoco_hopper", m.parse_mujoco_cfg, [],
            "sf_examples/mujoco/mujoco_params.py (mujoco_override_defaults)")


def train(args) -> None:
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.train import make_runner

    rec = Record(args.out, args.spawn, args.grid)
    name, parse, flags, source = _env(args.env)
    argv = [*flags, f"--env={name}", "--num_workers=2", "--device=cpu",
            f"--seed={args.seed}", f"--train_dir={args.out}", "--experiment=sf",
            f"--train_for_env_steps={args.budget}",
            f"--train_for_seconds={max(1, int(args.cap_s - rec.now()))}",
            "--keep_checkpoints=1", "--with_wandb=False"]
    cfg = parse(argv=argv)

    class Snapshots(AlgoObserver):
        def on_training_step(self, runner, iteration):
            steps = runner.env_steps.get(0, 0)
            rec.progress(steps)
            if rec.due(steps):
                runner._save_milestone_policy()
                while rec.next_snapshot <= steps:
                    rec.next_snapshot += rec.grid

    cfg, runner = make_runner(cfg)
    runner.register_observer(Snapshots())
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        runner.run()
    rec.close(settings={k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str,
                                                                          bool, list))},
              settings_source=source, argv=argv, torch_threads=torch.get_num_threads())


class Greedy(torch.nn.Module):
    def __init__(self, ac, rnn_size: int, act_dim: int | None):
        super().__init__()
        self.ac, self.rnn_size, self.act_dim = ac, rnn_size, act_dim

    def forward(self, obs):
        normalized = self.ac.normalize_obs({"obs": obs})
        head = self.ac.forward_head(normalized)
        core, _ = self.ac.forward_core(head, torch.zeros((obs.shape[0], self.rnn_size)))
        logits = self.ac.forward_tail(core, values_only=False, sample_actions=False)
        out = logits["action_logits"]
        return out if self.act_dim is None else out[..., :self.act_dim]


def export(args) -> None:
    """Every milestone as the common snapshot (after the run)."""
    import gymnasium as gym
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size
    from sample_factory.utils.attr_dict import AttrDict

    out = Path(args.out)
    _env(args.env)
    cfg = AttrDict(json.loads((out / "sf" / "config.json").read_text()))
    env = make_env_func_batched(cfg, env_config=AttrDict(worker_index=0, vector_index=0,
                                                         env_id=0))
    space = env.action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    obs_dim = env.observation_space["obs"].shape[0]
    def taken():
        for f in sorted((out / "sf" / "checkpoint_p0" / "milestones").glob("checkpoint_*.pth")):
            ac = create_actor_critic(cfg, env.observation_space, space)
            ac.load_state_dict(torch.load(f, map_location="cpu", weights_only=False)["model"])
            ac.eval()
            head = Greedy(ac, get_rnn_size(cfg), None if discrete else space.shape[0])
            greedy = Normalized(head) if discrete else Normalized(head, low=space.low,
                                                                   high=space.high)
            yield (int(f.stem.split("_")[-1]), f.stat().st_mtime - args.spawn, greedy,
                   torch.zeros((2, obs_dim)))

    write_snapshots(out, taken())


def main() -> int:
    args = side_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    export(args) if args.export else train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
