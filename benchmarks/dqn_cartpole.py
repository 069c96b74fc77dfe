"""Double DQN on CartPole-v1 through the CLI: a config chosen on tuning seeds, reported on others.

``pipelines/dqn_cartpole.yaml`` is what a user runs; the suite's test trains it on its own
seed. This benchmark is the evidence behind that file's settings:

* ``--phase tune`` trains every candidate below (overrides of the pipeline) on the tuning
  seeds (101, 102, ... by default) and ranks the candidates by solved runs, then median env
  steps to a confirmed solve;
* ``--phase report`` trains the pipeline as shipped on the reporting seeds (1, 2, ... by
  default, disjoint from the tuning seeds) and reports the solve rate with a Wilson 95%
  interval and the env steps and wall time to solve (median, bootstrap 95% CI).

Every run is ``dask-rl train pipelines/dqn_cartpole.yaml --set seed=S ...`` in a fresh process
on its own embedded 2-worker cluster; "solved" is the run's own verdict: a screening greedy
evaluation reached 475 and a 100-episode greedy evaluation on fresh seeds confirmed it (mean
>= 475 by the pipeline's margin). ``--parallel`` runs that many at once (2 halves each run's
speed on this 2-core machine; env steps to solve are what the ranking uses).

    python benchmarks/dqn_cartpole.py --phase tune --seeds 4 --parallel 2
    python benchmarks/dqn_cartpole.py --phase report --seeds 8 --parallel 2

Writes ``benchmarks/results/dqn_cartpole_{tune,report}.json`` with every run's effective config.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
PIPELINE = ROOT / "pipelines" / "dqn_cartpole.yaml"

from stats import bootstrap_ci  # noqa: E402
from train_cli import train_command  # noqa: E402

# candidates: overrides of the pipeline as shipped ("shipped": none)
CANDIDATES: dict[str, list[str]] = {
    "shipped": [],
    "lr5e-4": ["learner.lr=5e-4"],
    "target_every2": ["algo.target_every=2"],
    # the settings before this benchmark (a [120, 84] net, 32 gradient steps of 128 per
    # rollout, a target refresh every 4 updates, lr 5e-4, a 30k-step epsilon decay)
    "previous": ["model.hidden=[120,84]", "algo.batch_size=128", "algo.updates_per_task=32",
                 "algo.replay_ratio=8", "algo.target_every=4", "learner.lr=5e-4",
                 "algo.eps_end=0.05", "algo.eps_decay_steps=30000"],
}


def train(name: str, overrides: list[str], seed: int, budget: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        extra = [f"stop.env_steps={budget}"] if budget else []
        cmd = train_command(PIPELINE, run,
                            ["cluster.dashboard=false", f"seed={seed}", *overrides, *extra])
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        wall = time.time() - t0
        if proc.returncode != 0:
            return {"candidate": name, "seed": seed, "error": proc.stderr[-2000:], "wall_s": wall}
        s = json.loads((run / "summary.json").read_text())
        start = next(json.loads(line) for line in (run / "metrics.jsonl").open()
                     if '"kind": "run"' in line)
    conf = s.get("confirmation") or {}
    return {"candidate": name, "seed": seed, "overrides": overrides, "solved": bool(s["solved"]),
            "env_steps": s["env_steps"], "wall_s": wall,
            "confirmation_mean": conf.get("mean_return"), "final_return": s.get("final_return"),
            "stop_reason": s.get("stop_reason"), "config": start["config"]}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    solved = [r for r in ok if r["solved"]]
    steps = [r["env_steps"] for r in solved]
    walls = [r["wall_s"] for r in solved]
    out = {"runs": len(runs), "errors": len(runs) - len(ok), "solved": len(solved),
           "solve_rate_ci95": wilson(len(solved), len(ok))}
    if steps:
        out["median_env_steps"] = _median(steps)
        out["median_env_steps_ci95"] = bootstrap_ci(steps, stat=_median)
        out["median_wall_s_solved"] = float(_median(walls))
        out["median_wall_s_ci95"] = bootstrap_ci(walls, stat=_median)
    return out


def _median(x):
    import numpy as np

    return float(np.median(x))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("tune", "report"), required=True)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=None,
                    help="default: 101 to tune, 1 to report")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES))
    ap.add_argument("--budget", type=int, default=None, help="stop.env_steps override")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    first = args.first_seed if args.first_seed is not None else (101 if args.phase == "tune"
                                                                  else 1)
    seeds = list(range(first, first + args.seeds))
    names = args.candidates if args.phase == "tune" else ["shipped"]
    jobs = [(n, CANDIDATES[n], s) for s in seeds for n in names]
    runs: list[dict] = []
    with ThreadPoolExecutor(args.parallel) as pool:
        for r in pool.map(lambda j: train(j[0], j[1], j[2], args.budget), jobs):
            runs.append(r)
            print(f"{r['candidate']:18s} seed {r['seed']}: " + (
                "ERROR " + r["error"].splitlines()[-1] if "error" in r else
                f"solved={r['solved']} env_steps={r['env_steps']} "
                f"confirmation={r['confirmation_mean']} wall={r['wall_s']:.0f}s"), flush=True)
    table = {n: summarise([r for r in runs if r["candidate"] == n]) for n in names}
    for n, t in table.items():
        print(f"{n:18s} solved {t['solved']}/{t['runs'] - t['errors']} "
              f"(95% CI {t['solve_rate_ci95'][0]:.2f}-{t['solve_rate_ci95'][1]:.2f}), "
              f"median env steps {t.get('median_env_steps', '-')}")
    out = Path(args.out or HERE / "results" / f"dqn_cartpole_{args.phase}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "dqn_cartpole", "phase": args.phase,
                               "pipeline": str(PIPELINE.relative_to(ROOT)), "seeds": seeds,
                               "candidates": {n: CANDIDATES[n] for n in names},
                               "summary": table, "runs": runs}, indent=2))
    from stats import record_commit
    record_commit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
