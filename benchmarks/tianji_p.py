"""Does TianJi's on-policy ``P`` follow the learner count? The strict rule against the graded one.

TianJi's operating rules read ``P`` (the share of stale samples) against the learner count:
more learners make the data older, so ``P`` should grow with them. On-policy, a gradient's
samples are stale when the policy that collected them lags the learner's pull by more than
``aggregation.lag_tolerance`` versions (``dask_rl/staleness/tianji.py``). The strict rule
(tolerance 0) is what the ablation's TianJi rows ran; the default is 1
(``docs/decisions/tianji-on-policy-p.md``).

Two settings (``--env``): ``cartpole`` runs ``pipelines/ppo_cartpole_tianji.yaml`` as shipped;
``hopper`` runs the ablation's TianJi arm (``pipelines/ppo_hopper_stellaris.yaml`` on Hopper-v5
with ``aggregation.strategy=tianji``, no IS truncation, 4 rollout slots, 2 workers x 4
threads: ``benchmarks/ablation.py``'s staleness sweep). Each run is ``dask-rl train`` in a
fresh process on its own embedded cluster, ``--steps`` env steps, no evaluation, no solve stop;
sides differ only in ``learner.max_learners`` and ``aggregation.lag_tolerance``, and take
turns within each seed. Per run, from the learner records: the mean ``P`` the strategy used
(recomputed from the records as in the integration test: samples of the last ``window``
gradients, stale when their ``policy_lag`` exceeds the tolerance), the mean step factor
``1 / (1 + lambda P)`` (the ``weight`` the actor applied) and the mean policy lag. Mean with a
95% t-interval over seeds.

    python benchmarks/tianji_p.py --env cartpole --seeds 3
    python benchmarks/tianji_p.py --env hopper --seeds 3 --steps 60000 --learners 1 4 8

Writes ``benchmarks/results/tianji_p_{env}.json`` (every run's effective config) and prints a table.
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
sys.path.insert(0, str(ROOT))  # this checkout's dask_rl, whatever is installed

from stats import json_safe, mean_ci, record_commit  # noqa: E402
from train_cli import train_command  # noqa: E402

SETTINGS = {
    "cartpole": (ROOT / "pipelines" / "ppo_cartpole_tianji.yaml", []),
    "hopper": (ROOT / "pipelines" / "ppo_hopper_stellaris.yaml",
               ["env.id=Hopper-v5", "aggregation.strategy=tianji", "learner.is_truncation=false",
                "rollout.slots=4", "cluster.n_workers=2", "cluster.threads_per_worker=4"]),
}


def train(env: str, learners: int, tolerance: int, seed: int, steps: int) -> dict:
    pipeline, fixed = SETTINGS[env]
    settings = [*fixed, "cluster.dashboard=false", f"seed={seed}", f"stop.env_steps={steps}",
                "stop.solve_on_target=false", "stop.eval_every_updates=0",
                "checkpoint.every_s=0", f"learner.max_learners={learners}",
                f"aggregation.lag_tolerance={tolerance}"]
    side = {"env": env, "learners": learners, "lag_tolerance": tolerance, "seed": seed,
            "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t0 = time.time()
        proc = subprocess.run(train_command(pipeline, run, settings), capture_output=True,
                              text=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.time() - t0
        if proc.returncode != 0:
            return {**side, "error": proc.stderr[-2000:], "wall_s": wall}
        records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    config = next(r["config"] for r in records if r["kind"] == "run")
    window = config["aggregation"]["window"]
    learned = sorted((r for r in records if r["kind"] == "learner" and r["status"] == "applied"),
                     key=lambda r: r["version_after"])
    recent: list[tuple[int, int]] = []
    shares = []
    for r in learned:
        n = r["trajectory_steps"]
        recent.append((n, n if r["policy_lag"] > tolerance else 0))
        recent = recent[-window:]
        shares.append(sum(s for _, s in recent) / sum(m for m, _ in recent))
    return {**side, "wall_s": wall, "gradients": len(learned),
            "P_mean": float(np.mean(shares)), "weight_mean":
            float(np.mean([r["weight"] for r in learned])),
            "policy_lag_mean": float(np.mean([r["policy_lag"] for r in learned])),
            "config": config}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", choices=sorted(SETTINGS), default="cartpole")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40_000)
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--tolerances", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    args.out = args.out or HERE / "results" / f"tianji_p_{args.env}.json"
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for learners in args.learners:
            for tolerance in args.tolerances:
                r = train(args.env, learners, tolerance, seed, args.steps)
                runs.append(r)
                print(f"seed {seed} learners {learners} tolerance {tolerance}: "
                      + (f"P {r['P_mean']:.2f} weight {r['weight_mean']:.2f} "
                         f"lag {r['policy_lag_mean']:.2f} ({r['wall_s']:.0f} s)"
                         if "error" not in r else "FAILED " + r["error"][-300:]), flush=True)
    ok = [r for r in runs if "error" not in r]
    rows = []
    lines = ["| learners | lag_tolerance | seeds | P | step factor 1/(1+lambda P) | policy lag |",
             "|---|---|---|---|---|---|"]
    for learners in args.learners:
        for tolerance in args.tolerances:
            mine = [r for r in ok if r["learners"] == learners and r["lag_tolerance"] == tolerance]
            if len(mine) < 2:
                continue
            row = {"learners": learners, "lag_tolerance": tolerance, "seeds": len(mine),
                   **{k: mean_ci([r[k] for r in mine])
                      for k in ("P_mean", "weight_mean", "policy_lag_mean")}}
            rows.append(row)
            lines.append(f"| {learners} | {tolerance} | {len(mine)} | "
                         + " | ".join("{:.2f} [{:.2f}, {:.2f}]".format(*row[k])
                                      for k in ("P_mean", "weight_mean", "policy_lag_mean"))
                         + " |")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe({"args": {k: str(v) for k, v in vars(args).items()},
                                              "rows": rows, "runs": runs}), indent=1))
    record_commit(args.out)


if __name__ == "__main__":
    main()
