"""Learner step cost at two commits, side by side: one learner task of a shipped pipeline,
timed in one process on random data, the commits alternated so that machine noise falls on
both alike.

``pipelines/dqn_cartpole.yaml``: ``Learner.update_transitions`` on 8,192 transitions, 128
gradient steps of 64, what one replay learner task does.

    python benchmarks/learner_step.py --commits 4cef326 HEAD

Writes ``benchmarks/results/learner_step.json``: each commit's task times, their median with a
bootstrap 95% CI, the ratio of the medians with its CI, the commit the script ran from,
the torch version and thread count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# run inside one worktree's checkout: prints one task time per line
TIMER = r"""
import sys, time, numpy as np, torch, gymnasium as gym
torch.set_num_threads(1)
from dask_rl.config.loader import load_pipeline
from dask_rl.roles.learner import Learner
try:  # the commit this runs at may predate algos/replay.py
    from dask_rl.algos.replay import Transitions
except ImportError:
    from dask_rl.algos.dqn import Transitions
from dask_rl.data.results import PolicySnapshot
cfg = load_pipeline(sys.argv[1])
env = gym.make(cfg.env.id)
learner = Learner(cfg, env.observation_space, env.action_space, device="cpu")
p = learner.flat.detach().numpy().copy()
snap = PolicySnapshot(version=1, params=p, target_params=p.copy())
rng = np.random.default_rng(0)
n = cfg.algo.updates_per_task * cfg.algo.batch_size
dim = env.observation_space.shape[0]
data = Transitions(rng.normal(size=(n, dim)).astype(np.float32), rng.integers(0, 2, n),
                   rng.normal(size=n).astype(np.float32), np.full(n, 0.97, np.float32),
                   rng.normal(size=(n, dim)).astype(np.float32))
learner.update_transitions(snap, data, lr=1e-3, batch_size=cfg.algo.batch_size, seed=0)
for i in range(int(sys.argv[2])):
    t = time.perf_counter()
    learner.update_transitions(snap, data, lr=1e-3, batch_size=cfg.algo.batch_size, seed=i)
    print(time.perf_counter() - t)
"""


def _resolve(commit: str) -> str:
    return subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


def _times(tree: Path, repeats: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", TIMER,
                          str(ROOT / "pipelines" / "dqn_cartpole.yaml"), str(repeats)],
                         cwd=tree, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1",
                              "PATH": "/usr/bin:/bin"})
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", nargs=2, default=["HEAD~1", "HEAD"])
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the two commits")
    ap.add_argument("--repeats", type=int, default=10, help="tasks timed per round")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "learner_step.json")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from stats import bootstrap_ci, bootstrap_ratio_ci

    commits = [_resolve(c) for c in args.commits]
    times: dict[str, list[float]] = {c: [] for c in commits}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for c in commits:
            trees[c] = Path(tmp) / c[:12]
            subprocess.run(["git", "worktree", "add", "--detach", str(trees[c]), c], cwd=ROOT,
                           check=True, capture_output=True)
        try:
            for _ in range(args.rounds):
                for c in commits:
                    times[c] += _times(trees[c], args.repeats)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               capture_output=True)
    import torch

    first, second = commits
    ratio, lo, hi = bootstrap_ratio_ci(times[first], times[second])
    result = {"what": "one dqn_cartpole.yaml replay learner task (128 steps x 64) in one "
                      "process, seconds", "commit": _resolve("HEAD"),
              "pipeline": "pipelines/dqn_cartpole.yaml (as shipped at each commit)",
              "torch": torch.__version__, "threads": 1,
              "rounds": args.rounds, "repeats": args.repeats,
              "commits": {c: {"median_s": float(np.median(times[c])),
                              "median_95ci": bootstrap_ci(times[c], np.median),
                              "times": times[c]} for c in commits},
              "median_ratio_first_over_second": {"ratio": ratio, "95ci": [lo, hi]}}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for c in commits:
        r = result["commits"][c]
        print(f"{c[:12]}: median {r['median_s']:.3f} s, 95% CI "
              f"[{r['median_95ci'][0]:.3f}, {r['median_95ci'][1]:.3f}]")
    print(f"{first[:12]} / {second[:12]}: {ratio:.2f}x [{lo:.2f}, {hi:.2f}] -> {args.out}")


if __name__ == "__main__":
    main()
