"""Stellaris' ablation: the aggregation strategies at equal wall-time budgets.

For each environment (CartPole-v1, Hopper-v5), strategy and seed, one PPO run on an embedded
LocalCluster of 2 workers x 2 threads with 4 concurrent learners, stopped by wall time only
(``stop.wall_s``), then evaluated greedily. Strategies take turns within each seed, so machine
noise spreads over all of them. ``stellaris`` is the paper's method as specified (d = 0.96,
v = 3, global IS truncation, rho = 1) with the server step alpha0 that the paper leaves open
taken from the pipeline: 2 on CartPole (tuned: an update averages about two gradients there, and
alpha0 = 1 halved the progress per sample), 1 on Hopper; ``stellaris-auto`` is the same with
``decay: auto`` (ours); the baselines run at alpha0 = 1 without IS truncation.

    python benchmarks/ablation.py --cartpole-seeds 5 --hopper-seeds 3
    python benchmarks/ablation.py --envs Hopper-v5 --hopper-seeds 4 --from-seed 4 --merge

Writes ``benchmarks/results/ablation.{json,md}`` (mean +- std of final greedy return, updates,
mean staleness, the parameter actor's gate+apply share of wall time) and
``benchmarks/results/ablation.png`` (recent training return vs wall time, mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STRATEGIES = ["stellaris", "stellaris-auto", "async", "ssp", "softsync", "sync"]
PIPELINES = {"CartPole-v1": ROOT / "pipelines" / "ppo_cartpole_stellaris.yaml",
             "Hopper-v5": ROOT / "pipelines" / "ppo_hopper_stellaris.yaml"}
STRATEGY_SETTINGS = {
    # as in the pipelines: decay 0.96, v = 3, IS truncation on
    "stellaris": ["aggregation.strategy=stellaris"],
    "stellaris-auto": ["aggregation.strategy=stellaris", "aggregation.decay=auto"],
    "async": ["aggregation.strategy=async", "learner.is_truncation=false"],
    "ssp": ["aggregation.strategy=ssp", "aggregation.bound=3", "learner.is_truncation=false"],
    "softsync": ["aggregation.strategy=softsync", "aggregation.n=2",
                 "learner.is_truncation=false"],
    "sync": ["aggregation.strategy=sync", "learner.is_truncation=false"],
}


def one_run(env_id: str, strategy: str, seed: int, budget_s: float, workdir: Path) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    run_dir = workdir / f"{env_id}-{strategy}-{seed}"
    overrides = [*STRATEGY_SETTINGS[strategy],
                 f"seed={seed}", f"stop.wall_s={budget_s}", "stop.env_steps=100000000",
                 "stop.solve_on_target=false", "stop.eval_every_updates=0",
                 "checkpoint.every_s=0", "cluster.n_workers=2", "cluster.threads_per_worker=2",
                 "cluster.dashboard=false", "learner.max_learners=4"]
    res = dask_rl.train(PIPELINES[env_id], run_dir=run_dir, overrides=overrides)
    s = res.summary
    curve = [(round(r["wall_s"], 2), round(r["charts/return_recent"], 1))
             for r in read_metrics(run_dir / "metrics.jsonl")
             if r["kind"] == "learner" and r.get("charts/return_recent") is not None]
    return {"env_id": env_id, "strategy": strategy, "seed": seed, "budget_s": budget_s,
            "final_return": s["final_return"], "updates": s["updates"],
            "env_steps": s["env_steps"], "staleness_mean": s["staleness_mean"],
            "staleness_max": s["staleness_max"], "gradients_dropped": s["gradients_dropped"],
            "actor_apply_share": s["actor_apply_share"], "wall_s": s["wall_s"], "curve": curve}


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for env_id in dict.fromkeys(r["env_id"] for r in rows):
        for strategy in STRATEGIES:
            mine = [r for r in rows if r["env_id"] == env_id and r["strategy"] == strategy]
            if not mine:
                continue
            f = [r["final_return"] for r in mine]
            out.append({
                "env_id": env_id, "strategy": strategy, "runs": len(mine),
                "final_mean": statistics.mean(f),
                "final_std": statistics.stdev(f) if len(f) > 1 else 0.0,
                "updates": statistics.mean(r["updates"] for r in mine),
                "env_steps": statistics.mean(r["env_steps"] for r in mine),
                "staleness_mean": statistics.mean(r["staleness_mean"] for r in mine),
                "actor_share_pct": 100 * statistics.mean(r["actor_apply_share"] for r in mine),
            })
    return out


def table(summary: list[dict]) -> str:
    lines = ["| env | strategy | final greedy return (mean +- std) | updates | env steps | "
             "mean staleness | gate+apply % of wall |", "|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['env_id']} | {s['strategy']} | {s['final_mean']:.1f} +- "
                     f"{s['final_std']:.1f} | {s['updates']:.0f} | {s['env_steps']:.0f} | "
                     f"{s['staleness_mean']:.2f} | {s['actor_share_pct']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env_id"] for r in rows))
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4), squeeze=False)
    for ax, env_id in zip(axes[0], envs):
        budget = max(r["budget_s"] for r in rows if r["env_id"] == env_id)
        grid = np.linspace(0, budget, 100)
        for strategy in STRATEGIES:
            curves = []
            for r in rows:
                if r["env_id"] == env_id and r["strategy"] == strategy and r["curve"]:
                    t, y = np.array(r["curve"]).T
                    curves.append(np.interp(grid, t, y, left=np.nan))
            if curves:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean = np.nanmean(curves, axis=0)
                ax.plot(grid, mean, label=strategy)
        ax.set_title(f"{env_id}: PPO, 4 concurrent learners")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("recent training return")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cartpole-seeds", type=int, default=5)
    ap.add_argument("--hopper-seeds", type=int, default=3)
    ap.add_argument("--cartpole-s", type=float, default=20.0, help="budget per CartPole run")
    ap.add_argument("--hopper-s", type=float, default=180.0, help="budget per Hopper run")
    ap.add_argument("--envs", nargs="+", default=list(PIPELINES))
    ap.add_argument("--strategies", nargs="+", default=STRATEGIES)
    ap.add_argument("--out", default=str(HERE / "results" / "ablation"))
    ap.add_argument("--from-seed", type=int, default=1,
                    help="first seed to run; with --merge, adds seeds to an earlier result")
    ap.add_argument("--merge", action="store_true",
                    help="keep the runs already in OUT.json that this invocation does not redo")
    args = ap.parse_args()
    budgets = {"CartPole-v1": args.cartpole_s, "Hopper-v5": args.hopper_s}
    seeds = {"CartPole-v1": args.cartpole_seeds, "Hopper-v5": args.hopper_seeds}
    out = Path(args.out)
    rows = []
    if args.merge and out.with_suffix(".json").exists():
        rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in args.envs:
            for seed in range(args.from_seed, seeds[env_id] + 1):
                order = args.strategies[seed % len(args.strategies):] + \
                    args.strategies[:seed % len(args.strategies)]
                for strategy in order:
                    r = one_run(env_id, strategy, seed, budgets[env_id], Path(tmp))
                    rows = [x for x in rows if (x["env_id"], x["strategy"], x["seed"])
                            != (env_id, strategy, seed)] + [r]
                    print(f"{env_id:12s} {strategy:9s} seed {seed}: final {r['final_return']:8.1f}"
                          f"  updates {r['updates']:5d}  staleness {r['staleness_mean']:.2f}"
                          f"  ({time.time() - t0:.0f} s elapsed)", flush=True)
    summary = summarise(rows)
    md = table(summary)
    print("\n" + md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows}))
    out.with_suffix(".md").write_text(md + "\n")
    plot(rows, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
