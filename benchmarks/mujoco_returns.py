"""MuJoCo returns: PPO and IMPACT on Hopper-v5, several seeds, at equal env steps and wall time.

Runs ``pipelines/ppo_hopper_stellaris.yaml`` and ``pipelines/impact_hopper.yaml`` for
``--steps`` env steps (default 300k) on the embedded 2-worker cluster, ``--seeds`` seeds each
(the pipelines' hyperparameters were chosen on seed 1; the reported seeds start at 11), with a
greedy 5-episode evaluation every 25 updates. It reports, mean ± std over seeds:

* at **equal env steps**: the final greedy return after ``--steps`` steps;
* at **equal wall time**: for each seed, the greedy return of each algorithm at the last
  evaluation before the time the faster of the two needed for ``--steps`` steps.

A random policy's return is the floor (~20-30 on Hopper). ``--label`` files the results under a
name in the JSON (e.g. ``before`` / ``after`` a fix, run from two checkouts with the same
script), so that sides measured separately sit in one file; every run's effective settings are
written beside its numbers.

    python benchmarks/mujoco_returns.py --label after [--seeds 3] [--steps 300000]

Writes ``benchmarks/results/mujoco_returns.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RUNS = {"ppo": HERE.parent / "pipelines" / "ppo_hopper_stellaris.yaml",
        "impact": HERE.parent / "pipelines" / "impact_hopper.yaml"}
EVAL_EVERY = 25
EVAL_EPISODES = 5


def random_return(episodes: int = 10) -> float:
    import gymnasium as gym

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


def one_run(algo: str, seed: int, steps: int, extra: list[str]) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    overrides = [f"seed={seed}", f"stop.env_steps={steps}", "stop.solve_on_target=false",
                 f"stop.eval_every_updates={EVAL_EVERY}", f"stop.eval_episodes={EVAL_EPISODES}",
                 "cluster.dashboard=false", "checkpoint.every_s=0", *extra]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        result = dask_rl.train(RUNS[algo], run_dir=Path(tmp) / algo, overrides=overrides)
        total_s = time.time() - t0  # includes the cluster's start-up
        records = read_metrics(result.run_dir / "metrics.jsonl")
    config = next(r["config"] for r in records if r["kind"] == "run" and r["event"] == "start")
    start = next(r["time"] for r in records if r["kind"] == "run" and r["event"] == "start")
    evals = [(r["time"] - start, r["env_steps"], r["mean_return"]) for r in records
             if r["kind"] == "eval"]
    s = result.summary
    return {"algo": algo, "seed": seed, "final_return": s["final_return"],
            "best_return": s["best_return"], "env_steps": s["env_steps"],
            "train_s": s["wall_s"], "total_s": total_s, "updates": s["updates"],
            "staleness_mean": s["staleness_mean"], "evals": evals,
            "overrides": overrides, "config": config}


def at_time(run: dict, t: float) -> float:
    """The greedy return of the last evaluation made by time ``t`` (s since the run began)."""
    before = [ret for when, _, ret in run["evals"] if when <= t]
    return before[-1] if before else float("nan")


def ci95(values) -> float:
    """Half-width of a t-based 95% confidence interval of the mean."""
    from scipy import stats

    x = np.asarray([v for v in values if np.isfinite(v)], float)
    if len(x) < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))


def summarise(runs: list[dict]) -> dict:
    by_algo: dict[str, list[dict]] = {}
    for r in runs:
        by_algo.setdefault(r["algo"], []).append(r)
    out = {}
    for algo, rs in by_algo.items():
        finals = [r["final_return"] for r in rs]
        out[algo] = {"final_mean": float(np.mean(finals)), "final_std": float(np.std(finals)),
                     "final_ci95": ci95(finals),
                     "train_s_mean": float(np.mean([r["train_s"] for r in rs])),
                     "seeds": [r["seed"] for r in rs]}
    algos = sorted(by_algo)
    if len(algos) == 2:
        equal_time = {a: [] for a in algos}
        for seed in sorted({r["seed"] for r in runs}):
            pair = {a: next(r for r in by_algo[a] if r["seed"] == seed) for a in algos}
            t = min(p["evals"][-1][0] for p in pair.values())
            for a in algos:
                equal_time[a].append(at_time(pair[a], t))
        for a in algos:
            out[a]["equal_time_mean"] = float(np.nanmean(equal_time[a]))
            out[a]["equal_time_std"] = float(np.nanstd(equal_time[a]))
            out[a]["equal_time_ci95"] = ci95(equal_time[a])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=11)
    ap.add_argument("--algos", nargs="+", default=list(RUNS))
    ap.add_argument("--label", default="current")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra pipeline override for every run (recorded with the run)")
    ap.add_argument("--out", default=str(HERE / "results" / "mujoco_returns"))
    ap.add_argument("--report-only", action="store_true",
                    help="re-render the table from the JSON without running anything")
    args = ap.parse_args()
    out_path = Path(args.out).with_suffix(".json")
    data = json.loads(out_path.read_text()) if out_path.exists() else {}
    data = data if "labels" in data else {"labels": {}}
    if not args.report_only:
        data["random_return"] = random_return()
        print(f"random policy: {data['random_return']:.1f}")
        runs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for algo in args.algos:
                r = one_run(algo, seed, args.steps, args.extra)
                runs.append(r)
                print(f"{args.label} {algo} seed {seed}: greedy {r['final_return']:.1f} after "
                      f"{r['env_steps']} steps in {r['train_s']:.0f} s", flush=True)
        data["labels"][args.label] = {"steps": args.steps, "runs": runs}
    for block in data["labels"].values():
        block["summary"] = summarise(block["runs"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(data, indent=1))
    from stats import record_commit
    record_commit(out_path)
    lines = ["# PPO and IMPACT on Hopper-v5", "",
             f"`python benchmarks/mujoco_returns.py --label LABEL --seeds {args.seeds}`: "
             f"greedy return (5 episodes), mean ± std [95% CI half-width] over seeds; random "
             f"policy {data['random_return']:.1f}.", "",
             "| label | algorithm | seeds | at equal env steps | at equal wall time | "
             "training s |", "|---|---|---|---|---|---|"]
    for label, block in data["labels"].items():
        for algo, s in block["summary"].items():
            eq = (f"{s['equal_time_mean']:.0f} ± {s['equal_time_std']:.0f} "
                  f"[{s['equal_time_ci95']:.0f}]" if "equal_time_mean" in s else "-")
            lines.append(f"| {label} | {algo} | {len(s['seeds'])} | {s['final_mean']:.0f} ± "
                         f"{s['final_std']:.0f} [{s['final_ci95']:.0f}] | {eq} | "
                         f"{s['train_s_mean']:.0f} |")
    out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
