"""TianJi's scaling table (notes, Sec. 4.3, Fig. 6) on this machine: sampling throughput of
double DQN with 1, 2, 4 and 8 rollout slots and 1 or 2 learners, and where the bottleneck sits.

TianJi reports that with one learner throughput grows linearly from 1 to 4 actors, that at 8
actors training becomes the bottleneck, and that more learners restore near-linear scaling.
Here every configuration is one ``dask-rl`` training run of ``pipelines/dqn_cartpole.yaml``
(the replay path: rollouts fill a worker-resident buffer, sampled learners run all the time,
rollouts are held while the learners are behind the replay ratio) on a ``LocalCluster`` of
``slots + learners`` single-threaded worker processes, so every rollout slot and every
learner has a process of its own, as TianJi's actors and learners do. Configurations differ
only in ``rollout.slots`` and ``learner.max_learners``; each runs for ``--seconds`` after
its learners start, and the first ``--warmup`` of those seconds are not measured.

Per configuration and repeat, from the run's own ``metrics.jsonl`` over the measured window:

* **sampling steps/s**: env steps collected per second (the table's figure);
* **learned transitions/s**: gradient steps x batch rows per second;
* **learner busy**: learner task seconds / (window x learners): near 1, the learners are the
  bottleneck (rollouts wait for them); well below 1, the rollouts are;
* **rollout busy**: rollout collect seconds / (window x slots).

This machine has 2 cores: every process beyond two shares them, so the table shows where *this
machine* saturates, not TianJi's 640-core cluster. Repeats are interleaved (each repeat runs
every configuration once, in a shuffled order) and reported as mean with a 95% t-interval.

    python benchmarks/tianji_scaling.py --seconds 40 --repeats 3

Writes ``benchmarks/results/tianji_scaling.json`` (every run's effective config included) and
prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from stats import mean_ci  # noqa: E402


def measure(slots: int, learners: int, seconds: float, warmup: float, seed: int) -> dict:
    """One training run; its throughputs over the measured window."""
    from distributed import Client, LocalCluster

    import dask_rl
    from dask_rl.data.metrics import read_metrics

    overrides = [f"rollout.slots={slots}", f"learner.max_learners={learners}",
                 "stop.env_steps=100000000", "stop.solve_on_target=false",
                 "stop.eval_every_updates=0", "checkpoint.every_s=0", f"seed={seed}"]
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=slots + learners, threads_per_worker=1,
                         dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        run = Path(tmp) / "run"
        # the wall budget counts from the run's start; learners start once the buffer holds
        # learning_starts transitions, a few seconds in
        result = dask_rl.train(ROOT / "pipelines" / "dqn_cartpole.yaml", client=client,
                               run_dir=run, overrides=overrides + [
                                   f"stop.wall_s={seconds + warmup + 15}"])
        records = read_metrics(run / "metrics.jsonl")
    config = next(r for r in records if r["kind"] == "run")["config"]
    learner = [r for r in records if r["kind"] == "learner"]
    rollout = [r for r in records if r["kind"] == "rollout"]
    if not learner:
        raise RuntimeError(f"slots={slots}, learners={learners}: no learner ran")
    start = learner[0]["time"] + warmup
    end = max(learner[-1]["time"], rollout[-1]["time"])
    window = end - start
    win_rollout = [r for r in rollout if r["time"] >= start]
    win_learner = [r for r in learner if r["time"] >= start]
    steps = (win_rollout[-1]["env_steps"] - win_rollout[0]["env_steps"]) if win_rollout else 0
    span = win_rollout[-1]["time"] - win_rollout[0]["time"] if len(win_rollout) > 1 else window
    learned = sum(r["learner/epochs"] * r["learner/batch"] for r in win_learner)
    return {"slots": slots, "learners": learners, "seed": seed, "window_s": window,
            "sampling_steps_per_s": steps / span if span > 0 else 0.0,
            "learned_per_s": learned / window,
            "learner_busy": sum(r["learner/task_s"] for r in win_learner) / (window * learners),
            "rollout_busy": sum(r["rollout/collect_s"] for r in win_rollout) / (window * slots),
            "stop_reason": result.summary["stop_reason"], "config": config}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=40.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds after the first learner that are not measured")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=100, help="first run seed")
    ap.add_argument("--out", default=str(HERE / "results" / "tianji_scaling.json"))
    args = ap.parse_args()
    grid = [(s, n) for n in args.learners for s in args.slots]
    runs = []
    order = random.Random(args.seed)
    for rep in range(args.repeats):
        cells = grid[:]
        order.shuffle(cells)
        for slots, learners in cells:
            t0 = time.time()
            row = measure(slots, learners, args.seconds, args.warmup, args.seed + rep)
            runs.append(row)
            print(f"repeat {rep} slots={slots} learners={learners}: "
                  f"{row['sampling_steps_per_s']:.0f} steps/s, learner busy "
                  f"{row['learner_busy']:.2f}, rollout busy {row['rollout_busy']:.2f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    table = []
    for slots, learners in grid:
        mine = [r for r in runs if (r["slots"], r["learners"]) == (slots, learners)]
        cell = {"slots": slots, "learners": learners, "n": len(mine)}
        for key in ("sampling_steps_per_s", "learned_per_s", "learner_busy", "rollout_busy"):
            m, lo, hi = mean_ci([r[key] for r in mine])
            cell[key] = {"mean": m, "ci95": [lo, hi]}
        table.append(cell)
    print("\n| learners | rollout slots | sampling steps/s (95% CI) | learned transitions/s | "
          "learner busy | rollout busy |")
    print("|---|---|---|---|---|---|")
    for c in table:
        s = c["sampling_steps_per_s"]
        print(f"| {c['learners']} | {c['slots']} | {s['mean']:.0f} ({s['ci95'][0]:.0f}-"
              f"{s['ci95'][1]:.0f}) | {c['learned_per_s']['mean']:.0f} | "
              f"{c['learner_busy']['mean']:.2f} | {c['rollout_busy']['mean']:.2f} |")
    out = {"benchmark": "tianji_scaling", "args": vars(args),
           "machine": {"cpus": __import__("os").cpu_count()},
           "median_window_s": statistics.median(r["window_s"] for r in runs),
           "table": table, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    from stats import record_commit
    record_commit(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
