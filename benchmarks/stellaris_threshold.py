"""Stellaris' threshold floor: what beta_k = delta_max d^k does once it decays toward 0.

The paper's threshold ``beta_k = delta_max * d^k`` (d = 0.96) has no floor: ``beta_k`` goes to
0, and with the paper's strict ``delta < beta_k`` every stale buffer waits — for fresher
gradients, or for the buffer to hold one gradient per learner. The engine's gate is
``delta < beta_k`` or ``delta <= floor``: the released code aggregates on ``mean <= bound``
with ``bound >= 1``, so floor 1 (the default) is that gate at its lowest bound. This compares
floors 0 (the paper as written, except that an all-fresh buffer never waits), 1 and 2 on the
discrete-event model of ``simulate_scale.py`` — the real strategy code driven by N simulated
learners on a noisy quadratic — over several seeds, reporting mean and 95% CI of: updates per
time unit, final error (relative to the start), mean applied staleness, and how the updates
were released.

    python benchmarks/stellaris_threshold.py [--seeds 5] [--learners 4 16 64]

Writes ``benchmarks/results/stellaris_threshold.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import simulate_scale  # noqa: E402

from dask_rl.staleness import StellarisConfig  # noqa: E402

FLOORS = (0.0, 1.0, 2.0)


def ci95(values) -> tuple[float, float]:
    """Mean and the half-width of a t-based 95% confidence interval."""
    from scipy import stats

    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1)
                                  / np.sqrt(len(x)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--learners", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--horizon", type=float, default=120.0)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--out", default=str(HERE / "results" / "stellaris_threshold"))
    args = ap.parse_args()
    for floor in FLOORS:
        simulate_scale.STRATEGIES[f"floor-{floor:g}"] = StellarisConfig(threshold_floor=floor)
    runs, rows = [], []
    for n in args.learners:
        for floor in FLOORS:
            name = f"floor-{floor:g}"
            per_seed = [simulate_scale.simulate(name, n, horizon=args.horizon, lr=args.lr,
                                                service_s=1e-3, seed=seed)
                        for seed in range(args.first_seed, args.first_seed + args.seeds)]
            runs += per_seed
            m = [r["strategy_metrics"] for r in per_seed]
            row = {"learners": n, "floor": floor}
            for key, values in (
                    ("updates_per_time", [r["updates_per_time"] for r in per_seed]),
                    ("final_error", [r["final_error"] for r in per_seed]),
                    ("staleness_mean", [r["staleness_mean"] for r in per_seed]),
                    ("waits_per_gradient", [x["threshold/waits"] / max(r["gradients"], 1)
                                            for x, r in zip(m, per_seed)]),
                    ("released_full_share", [x["threshold/released_full"]
                                             / max(r["updates"], 1)
                                             for x, r in zip(m, per_seed)])):
                row[key], row[key + "_ci95"] = ci95(values)
            rows.append(row)
            print(f"N={n:3d} floor {floor:g}: updates/t {row['updates_per_time']:6.2f} "
                  f"+- {row['updates_per_time_ci95']:.2f}, error {row['final_error']:.3g} "
                  f"+- {row['final_error_ci95']:.2g}, staleness {row['staleness_mean']:.2f}, "
                  f"waits/gradient {row['waits_per_gradient']:.2f}, released full "
                  f"{row['released_full_share']:.2f}", flush=True)
    config = {"seeds": list(range(args.first_seed, args.first_seed + args.seeds)),
              "learners": args.learners, "horizon": args.horizon, "lr": args.lr,
              "floors": FLOORS, "service_s": 1e-3,
              "strategy": {f: vars(StellarisConfig(threshold_floor=f)) for f in FLOORS}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"config": config, "rows": rows,
                                                    "runs": runs}, indent=1, default=str))
    from stats import record_commit
    record_commit(out.with_suffix(".json"))
    lines = ["# Stellaris threshold floor (simulated learners)", "",
             f"`python benchmarks/stellaris_threshold.py --seeds {args.seeds}`; seeds "
             f"{config['seeds'][0]}-{config['seeds'][-1]}, horizon {args.horizon} learner-times,"
             f" mean and 95% CI over seeds.", "",
             "| learners | floor | updates / time | final error | mean staleness | "
             "waits / gradient | released on a full buffer |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['learners']} | {r['floor']:g} | {r['updates_per_time']:.2f} ± "
            f"{r['updates_per_time_ci95']:.2f} | {r['final_error']:.3g} ± "
            f"{r['final_error_ci95']:.2g} | {r['staleness_mean']:.2f} ± "
            f"{r['staleness_mean_ci95']:.2f} | {r['waits_per_gradient']:.2f} | "
            f"{r['released_full_share']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
