"""Atari on dask-rl: rollout env steps/s on Pong vs the raw vector env, learner samples/s, and
a short PPO run on 2 CPU workers.

1. **Rollouts**: env steps/s of rollout tasks (8 Pong envs x 128 steps, Nature-CNN inference)
   on 2 workers, side by side with the raw single-process rate of the same vector env with the
   same policy inference; the ratio is against 2 x raw, and against two raw processes
   stepping at once (what this machine's two cores give two samplers without any framework).
2. **Learners**: samples/s of the PPO learner update (4 epochs x 4 minibatches of 256 frames)
   on the CPU, and on CUDA when a GPU is visible.
3. **A short run**: ``pipelines/ppo_pong.yaml`` for ``--pong-steps`` env steps (default 50k) on
   an embedded 2-worker cluster: steps/s and the learner's share of the workers' time.

    python benchmarks/atari_throughput.py

Writes ``benchmarks/results/atari_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPELINE = HERE.parent / "pipelines" / "ppo_pong.yaml"


def learner_rate(cfg, device: str, repeats: int = 3) -> float:
    import torch

    from dask_rl.data import PolicySnapshot
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.collector import Collector
    from dask_rl.roles.learner import Learner

    torch.set_num_threads(1)
    spaces = env_spaces(cfg.env)
    snap = PolicySnapshot(0, get_flat(make_model(*spaces, cfg.model, seed=0)))
    rw = Collector(cfg, seed=0)
    rw.load(snap)
    traj = rw.collect(cfg.rollout.steps)
    learner = Learner(cfg, *spaces, device=device)
    learner.update(snap, traj, lr=1e-4, seed=0)  # warm-up
    t0 = time.perf_counter()
    for i in range(repeats):
        learner.update(snap, traj, lr=1e-4, seed=i)
    return repeats * traj.env_steps * cfg.learner.epochs / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--pong-steps", type=int, default=50_000)
    ap.add_argument("--out", default=str(HERE / "results" / "atari_throughput.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import sampling_throughput as st
    import torch

    import dask_rl
    from dask_rl.api import resolve

    cfg = resolve(PIPELINE)
    plain = st.plain_rate(cfg, args.seconds)
    distributed = st.dask_rate(cfg, 2, args.seconds)
    both = st.concurrent_plain_rate(cfg, 2, args.seconds)
    out = {"rollout": {"plain_steps_per_s": plain, "dask_2_workers_steps_per_s": distributed,
                       "plain_2_processes_at_once_steps_per_s": both,
                       "ratio_vs_2x_plain": distributed / (2 * plain),
                       "ratio_vs_2_plain_at_once": distributed / both}}
    print(f"rollouts: plain {plain:.0f} steps/s, two plain processes at once {both:.0f} steps/s,"
          f" dask-rl on 2 workers {distributed:.0f} steps/s; ratio vs 2x plain "
          f"{out['rollout']['ratio_vs_2x_plain']:.2f}, vs two plain at once "
          f"{out['rollout']['ratio_vs_2_plain_at_once']:.2f}", flush=True)
    out["learner"] = {"cpu_samples_per_s": learner_rate(cfg, "cpu")}
    if torch.cuda.is_available():
        out["learner"]["cuda_samples_per_s"] = learner_rate(cfg, "cuda", repeats=10)
    print("learner: " + ", ".join(f"{k} {v:.0f}" for k, v in out["learner"].items()),
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        s = dask_rl.train(PIPELINE, run_dir=Path(tmp) / "pong", overrides=[
            f"stop.env_steps={args.pong_steps}", "stop.eval_episodes=1",
            "stop.eval_every_updates=0", "checkpoint.every_s=0",
            "cluster.dashboard=false"]).summary
    out["short_run"] = {k: s[k] for k in ("env_steps", "wall_s", "steps_per_s", "updates",
                                           "learner_time_share", "rollout_time_share",
                                           "final_return", "staleness_mean")}
    print(f"short PPO Pong run: {s['env_steps']} env steps in {s['wall_s']:.0f} s "
          f"({s['steps_per_s']:.0f} steps/s collected), learner share of worker time "
          f"{100 * s['learner_time_share']:.0f}%, rollout share "
          f"{100 * s['rollout_time_share']:.0f}%, greedy return {s['final_return']:.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    from stats import record_commit
    record_commit(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
