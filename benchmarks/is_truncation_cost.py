"""What Stellaris' global IS truncation costs: traffic, forward passes and learner time.

With ``learner.is_truncation`` every learner, before each of its epochs, sends its current
parameters to the parameter actor and receives the other active learners' current parameters
(one actor call: ``P`` floats out, ``(k-1) P`` back, ``k`` learners active), then evaluates the
whole batch under each of them (``k-1`` extra forward passes per epoch). This runs the
Stellaris CartPole pipeline (and, with ``--hopper``, the Hopper one) with the truncation on
and off, same seeds, same budget, one after the other on the embedded 2-worker cluster, and
reports per learner task: exchanges, bytes moved, forward passes, the seconds they took and
their share of the learner task, and the run's env steps per second on both sides.

    python benchmarks/is_truncation_cost.py [--seeds 2] [--steps 80000] [--hopper]

Writes ``benchmarks/results/is_truncation_cost.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PIPELINES = {"CartPole": HERE.parent / "pipelines" / "ppo_cartpole_stellaris.yaml",
             "Hopper": HERE.parent / "pipelines" / "ppo_hopper_stellaris.yaml"}


def run(pipeline: Path, seed: int, steps: int, truncation: bool) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    overrides = [f"seed={seed}", f"stop.env_steps={steps}", "stop.solve_on_target=false",
                 "stop.eval_every_updates=0", "cluster.dashboard=false", "checkpoint.every_s=0",
                 f"learner.is_truncation={str(truncation).lower()}"]
    with tempfile.TemporaryDirectory() as tmp:
        result = dask_rl.train(pipeline, run_dir=Path(tmp) / "run", overrides=overrides)
        learners = [r for r in read_metrics(result.run_dir / "metrics.jsonl")
                    if r["kind"] == "learner"]
    s = result.summary

    def mean(key: str) -> float:
        return float(np.mean([r.get(key, 0.0) for r in learners]))

    task_s = mean("learner/task_s")
    cost_s = mean("learner/cross_exchange_s") + mean("learner/cross_forward_s")
    return {"seed": seed, "truncation": truncation, "overrides": overrides,
            "steps_per_s": s["steps_per_s"], "final_return": s["final_return"],
            "learner_tasks": len(learners), "task_s": task_s,
            "exchanges": mean("learner/cross_exchanges"),
            "bytes": mean("learner/cross_bytes"),
            "forward_passes": mean("learner/cross_forward_passes"),
            "other_policies_max": max((r.get("learner/cross_policies", 0) for r in learners),
                                      default=0),
            "cost_s": cost_s, "cost_share": cost_s / task_s if task_s else 0.0,
            "truncated_frac": mean("losses/is_truncated_frac")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=11)
    ap.add_argument("--steps", type=int, default=80_000)
    ap.add_argument("--hopper", action="store_true", help="also Hopper-v5 (mujoco extra)")
    ap.add_argument("--out", default=str(HERE / "results" / "is_truncation_cost"))
    args = ap.parse_args()
    envs = ["CartPole"] + (["Hopper"] if args.hopper else [])
    rows = []
    for env in envs:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for truncation in (True, False):
                r = run(PIPELINES[env], seed, args.steps, truncation)
                r["env"] = env
                rows.append(r)
                print(f"{env} seed {seed} truncation {truncation}: {r['steps_per_s']:.0f} "
                      f"steps/s, {r['exchanges']:.1f} exchanges, {r['bytes'] / 1e3:.1f} kB, "
                      f"{r['forward_passes']:.1f} forward passes, {r['cost_s'] * 1e3:.1f} ms "
                      f"= {100 * r['cost_share']:.1f}% of a learner task", flush=True)
    lines = ["# The cost of Stellaris' global IS truncation", "",
             f"`python benchmarks/is_truncation_cost.py --seeds {args.seeds} --steps "
             f"{args.steps}{' --hopper' if args.hopper else ''}`; per learner task, mean over "
             f"its tasks and over seeds; steps/s ratio on/off measured in the same session.", "",
             "| env | exchanges | kB moved | extra forward passes | extra ms | share of task | "
             "truncated samples | steps/s on / off |", "|---|---|---|---|---|---|---|---|"]
    for env in envs:
        on = [r for r in rows if r["env"] == env and r["truncation"]]
        off = [r for r in rows if r["env"] == env and not r["truncation"]]
        ratio = np.mean([a["steps_per_s"] / b["steps_per_s"] for a, b in zip(on, off)])
        lines.append(
            f"| {env} | {np.mean([r['exchanges'] for r in on]):.1f} | "
            f"{np.mean([r['bytes'] for r in on]) / 1e3:.1f} | "
            f"{np.mean([r['forward_passes'] for r in on]):.1f} | "
            f"{1e3 * np.mean([r['cost_s'] for r in on]):.1f} | "
            f"{100 * np.mean([r['cost_share'] for r in on]):.1f}% | "
            f"{100 * np.mean([r['truncated_frac'] for r in on]):.1f}% | {ratio:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "runs": rows},
                                                   indent=1))
    from stats import record_commit
    record_commit(out.with_suffix(".json"))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
