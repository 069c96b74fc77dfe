"""MuJoCo returns: PPO and IMPACT on Hopper-v5 for 300k env steps each, 2 workers.

Runs ``pipelines/ppo_hopper_stellaris.yaml`` and ``pipelines/impact_hopper.yaml`` for
``--steps`` (default 300k) and records the final greedy return against a random policy's
(~20 on Hopper; the target is a clear margin above it, > 500).

    python benchmarks/mujoco_returns.py

Writes ``benchmarks/results/mujoco_returns.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"ppo": HERE.parent / "pipelines" / "ppo_hopper_stellaris.yaml",
        "impact": HERE.parent / "pipelines" / "impact_hopper.yaml"}


def random_return(episodes: int = 10) -> float:
    import gymnasium as gym
    import numpy as np

    env = gym.make("Hopper-v5")
    env.action_space.seed(0)
    returns = []
    for k in range(episodes):
        env.reset(seed=k)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += r
            done = term or trunc
        returns.append(total)
    return float(np.mean(returns))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--algos", nargs="+", default=list(RUNS))
    ap.add_argument("--out", default=str(HERE / "results" / "mujoco_returns.json"))
    args = ap.parse_args()
    import dask_rl

    out = {"random_return": random_return()}
    print(f"random policy: {out['random_return']:.1f}")
    for algo in args.algos:
        with tempfile.TemporaryDirectory() as tmp:
            s = dask_rl.train(RUNS[algo], run_dir=Path(tmp) / algo, overrides=[
                f"stop.env_steps={args.steps}", "stop.solve_on_target=false",
                "cluster.dashboard=false", "checkpoint.every_s=0"]).summary
        out[algo] = {k: s[k] for k in ("env_steps", "wall_s", "final_return", "best_return",
                                        "updates", "staleness_mean", "strategy")}
        print(f"{algo}: greedy return {s['final_return']:.1f} after {s['env_steps']} steps "
              f"in {s['wall_s']:.0f} s (best {s['best_return']:.1f})", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
