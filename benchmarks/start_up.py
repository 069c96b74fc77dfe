"""How long ``dask-rl train`` takes to start: from the command's spawn to its run's first
records, at two commits side by side.

Each repeat runs ``python -m dask_rl.cli train pipelines/ppo_cartpole.yaml`` (the README's
main job, its embedded 2-worker cluster with the dashboard, as a user runs it) for 4,096 env
steps, once with each commit's code (``PYTHONPATH`` at a worktree of that commit), the
commits taking turns to go first. From the run's ``metrics.jsonl``: the wall seconds from the
spawn to the ``run`` start record (the cluster up, the parameter actor placed, the first
rollouts about to go) and to the first learner record (a trajectory collected and learned).
Beside them, one plain process that imports what the single-process side of
``cartpole_time_to_solve.py`` imports and collects one trajectory: what any PPO on CartPole
pays before its first step.

    python benchmarks/start_up.py --old c1efce9 --new HEAD --repeats 5

Writes ``benchmarks/results/start_up.json`` (the commits, every run, medians with 95% CIs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

PLAIN = """
import time, sys
t_spawn = float(sys.argv[1])
import torch
from dask_rl.api import resolve
from dask_rl.roles.collector import Collector
torch.set_num_threads(1)
cfg = resolve(sys.argv[2], [])
Collector(cfg, seed=0).collect(cfg.rollout.steps)
print(time.time() - t_spawn)
"""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def one_run(src: Path, work: Path) -> dict:
    run_dir = Path(tempfile.mkdtemp(dir=work))
    spawn = time.time()
    subprocess.run([sys.executable, "-m", "dask_rl.cli", "train",
                    str(ROOT / "pipelines" / "ppo_cartpole.yaml"), "--no-progress",
                    "--run-dir", str(run_dir / "run"), "--set", "stop.env_steps=4096",
                    "--set", "stop.eval_every_updates=0", "--set", "stop.target_return=1e9"],
                   cwd=work, env={**os.environ, "PYTHONPATH": str(src)}, check=True,
                   capture_output=True)
    done = time.time()
    records = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").open()]
    start = next(r["time"] for r in records if r["kind"] == "run" and r.get("event") == "start")
    learner = next(r["time"] for r in records if r["kind"] == "learner")
    return {"to_run_start_s": start - spawn, "to_first_learner_s": learner - spawn,
            "whole_command_s": done - spawn}


def plain_run(src: Path) -> float:
    out = subprocess.run([sys.executable, "-c", PLAIN, repr(time.time()),
                          str(ROOT / "pipelines" / "ppo_cartpole.yaml")],
                         env={**os.environ, "PYTHONPATH": str(src)}, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    from stats import bootstrap_ci

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "start_up.json"))
    args = ap.parse_args()
    commits = {"old": _git("rev-parse", args.old), "new": _git("rev-parse", args.new)}
    runs: dict[str, list] = {"old": [], "new": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for side, commit in commits.items():
            trees[side] = Path(tmp) / side
            _git("worktree", "add", "--detach", str(trees[side]), commit)
        try:
            for rep in range(args.repeats):
                for side in (("old", "new") if rep % 2 == 0 else ("new", "old")):
                    r = one_run(trees[side], Path(tmp))
                    runs[side].append(r)
                    print(side, rep, {k: round(v, 2) for k, v in r.items()}, flush=True)
                runs["plain"].append(plain_run(trees["new"]))
                print("plain", rep, round(runs["plain"][-1], 2), flush=True)
        finally:
            for tree in trees.values():
                _git("worktree", "remove", "--force", str(tree))
    summary = {}
    for side in ("old", "new"):
        for key in ("to_run_start_s", "to_first_learner_s", "whole_command_s"):
            xs = [r[key] for r in runs[side]]
            summary[f"{side} {key}"] = {"median": float(np.median(xs)),
                                        "ci95": list(bootstrap_ci(xs, np.median))}
    summary["plain to_first_trajectory_s"] = {
        "median": float(np.median(runs["plain"])),
        "ci95": list(bootstrap_ci(runs["plain"], np.median))}
    out = {"benchmark": "start_up", "commit": _git("rev-parse", "HEAD"), "commits": commits,
           "config": {"pipeline": "ppo_cartpole.yaml", "repeats": args.repeats,
                      "overrides": ["stop.env_steps=4096", "stop.eval_every_updates=0",
                                    "stop.target_return=1e9"]},
           "machine_cores": os.cpu_count(), "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
