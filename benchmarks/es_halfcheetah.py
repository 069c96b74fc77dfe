"""ES on HalfCheetah-v5 within a small budget: the noiseless return before and after.

Runs ``pipelines/es_halfcheetah.yaml`` on an embedded 2-worker cluster for ``--generations``
generations (default 40) and records the mean parameters' noiseless return at generation 0 and
at the end; the improvement is the figure the population issue asks for.

    python benchmarks/es_halfcheetah.py

Writes ``benchmarks/results/es_halfcheetah.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPELINE = HERE.parent / "pipelines" / "es_halfcheetah.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=40)
    ap.add_argument("--out", default=str(HERE / "results" / "es_halfcheetah.json"))
    args = ap.parse_args()
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    pairs, episode = 24, 1000
    budget = args.generations * pairs * 2 * episode
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "es"
        s = dask_rl.train(PIPELINE, run_dir=run_dir, overrides=[
            f"stop.env_steps={budget}", "stop.solve_on_target=false", "algo.eval_every=10",
            "cluster.dashboard=false", "checkpoint.every_s=0"]).summary
        evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    first, last = evals[0], evals[-1]
    out = {"generations": s["generations"], "env_steps": s["env_steps"], "wall_s": s["wall_s"],
           "initial_return": first["mean_return"], "final_return": last["mean_return"],
           "improvement": last["mean_return"] - first["mean_return"],
           "evaluations": [(r["env_steps"], r["mean_return"]) for r in evals]}
    print(f"ES on HalfCheetah-v5: noiseless return {out['initial_return']:.1f} at generation 0 "
          f"-> {out['final_return']:.1f} after {out['generations']} generations "
          f"({out['env_steps']} env steps, {out['wall_s']:.0f} s)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    from stats import record_commit
    record_commit(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
