"""Where the learners' Adam moments live, decided by learning at equal wall time.

``learner.optimizer_state: shared`` (the default) keeps the moments with the parameter actor:
every learner pull and push carries them (3x the parameters' bytes), and each update averages
them over its gradients. ``local`` keeps them in each worker's learner between its tasks:
only parameters and deltas travel, so the service serves more calls per second
(``benchmarks/parameter_service.py``), but each learner's moments see only its own
gradients. Pushes per second cannot decide between them; learning can.

Both sides run ``pipelines/ppo_hopper_stellaris.yaml`` as ``dask-rl train`` would (the
embedded 2-worker cluster, its strategy and learners), stopped by wall time only
(``stop.wall_s``, counted from when the run opens), then judged by the same greedy evaluation
of the final policy (``--eval-episodes`` episodes, the run's own final evaluation, no target).
Only ``learner.optimizer_state`` differs; seeds alternate which side goes first. Nothing is
tuned here: both sides take the pipeline's settings.

    python benchmarks/optimizer_state.py --seeds 8 --budget-s 60

Writes ``benchmarks/results/optimizer_state.json``: the commit, every run's effective
config, final greedy return, env steps and updates, and the shared-minus-local difference of
means with its Welch 95% interval and p value.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ROOT = HERE.parent
PIPELINE = ROOT / "pipelines" / "ppo_hopper_stellaris.yaml"
SIDES = ("shared", "local")


def one_run(side: str, seed: int, args) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    overrides = [f"learner.optimizer_state={side}", f"seed={seed}",
                 f"stop.wall_s={args.budget_s}", "stop.env_steps=1000000000",
                 "stop.solve_on_target=false", "stop.eval_every_updates=0",
                 "stop.target_return=1e9", f"stop.eval_episodes={args.eval_episodes}",
                 "checkpoint.every_s=0", "cluster.dashboard=false"]
    with tempfile.TemporaryDirectory() as tmp:
        res = dask_rl.train(str(PIPELINE), run_dir=Path(tmp) / "run", overrides=overrides)
        records = read_metrics(Path(tmp) / "run" / "metrics.jsonl")
    s = res.summary
    config = next(r["config"] for r in records if r["kind"] == "run" and r["event"] == "start")
    return {"side": side, "seed": seed, "final_return": s["final_return"],
            "env_steps": s["env_steps"], "updates": s["updates"], "wall_s": s["wall_s"],
            "staleness_mean": s["staleness_mean"], "config": config}


def main() -> int:
    from stats import mean_ci, record_commit, welch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=301,
                    help="seeds first-seed, first-seed+1, ... (none used to tune anything)")
    ap.add_argument("--budget-s", type=float, default=60.0, help="wall budget per run")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--out", default=str(HERE / "results" / "optimizer_state.json"))
    args = ap.parse_args()
    rows = []
    for k in range(args.seeds):
        seed = args.first_seed + k
        for side in (SIDES if k % 2 == 0 else SIDES[::-1]):
            r = one_run(side, seed, args)
            rows.append(r)
            print(f"{side:6s} seed {seed}: final greedy {r['final_return']:8.1f}, "
                  f"{r['env_steps']} env steps, {r['updates']} updates", flush=True)
    by = {s: [r["final_return"] for r in rows if r["side"] == s] for s in SIDES}
    steps = {s: [r["env_steps"] for r in rows if r["side"] == s] for s in SIDES}
    out = {"benchmark": "optimizer_state",
           "command": " ".join(sys.argv), "pipeline": PIPELINE.name,
           "settings": vars(args), "sides": {}, "rows": rows}
    for s in SIDES:
        m, lo, hi = mean_ci(by[s])
        sm, slo, shi = mean_ci(steps[s])
        out["sides"][s] = {"final_return": {"mean": m, "ci95": [lo, hi]},
                           "env_steps": {"mean": sm, "ci95": [slo, shi]}, "n": len(by[s])}
    out["shared_minus_local"] = welch(by["shared"], by["local"])
    out["medians"] = {s: float(np.median(by[s])) for s in SIDES}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1, default=str))
    Path(args.out).write_text(json.dumps(out, indent=1))
    record_commit(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
