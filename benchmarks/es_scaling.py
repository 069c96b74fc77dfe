"""ES throughput: generations/s at 1 and 2 workers here, and a projection to many workers.

Runs ``pipelines/es_cartpole.yaml`` (fixed seed, no early stop) for a fixed number of
generations on LocalClusters of 1 and 2 single-threaded workers, then reads the run's
metrics: per-generation wall time, evaluation work (episode steps) and the update task. The
projection to W workers is a model, labelled as such: a generation costs the evaluation work
divided over min(W, tasks) workers, plus the scheduler's per-task cost (1/3,000 s: the no-op
task rate FACTS.md measured on this stack), plus the update on the parameter actor (measured),
plus the driver's per-generation fixed cost (measured); it states which term dominates.

    python benchmarks/es_scaling.py --generations 12

Writes ``benchmarks/results/es_scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPELINE = HERE.parent / "pipelines" / "es_cartpole.yaml"
SCHEDULER_TASKS_PER_S = 3000  # FACTS.md: no-op tasks/s with worker-saturation inf


def measure(workers: int, generations: int, pairs: int, pairs_per_task: int) -> dict:
    from distributed import Client, LocalCluster, get_task_stream

    import dask_rl
    from dask_rl.data.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None,
                         silence_logs=50) as cluster, Client(cluster) as client:
        with get_task_stream(client) as ts:
            try:
                dask_rl.train(PIPELINE, client=client, run_dir=Path(tmp) / "es", overrides=[
                    "stop.solve_on_target=false", f"algo.pairs={pairs}",
                    f"algo.pairs_per_task={pairs_per_task}", "algo.eval_every=1000000",
                    f"stop.env_steps={10**9}", "checkpoint.every_s=0", "seed=1"],
                    progress=_StopAfter(generations))
            except _Done:
                pass
        gens = [r for r in read_metrics(Path(tmp) / "es" / "metrics.jsonl")
                if r["kind"] == "generation"]
    evals, updates = [], []
    for task in ts.data:
        for ss in task["startstops"]:
            if ss["action"] == "compute":
                (updates if "es-update" in str(task["key"]) else
                 evals if "es-eval" in str(task["key"]) else []).append(ss["stop"] - ss["start"])
    per_gen = [r["es/generation_s"] for r in gens[1:]]  # the first includes warm-up
    tasks = len(evals) / max(len(gens), 1)
    eval_work = sum(evals) / max(len(gens), 1)
    gen_s = statistics.median(per_gen)
    update_s = statistics.median(updates) if updates else 0.0
    overhead = max(gen_s - eval_work / min(workers, tasks) - update_s, 0.0)
    return {"workers": workers, "generations": len(gens), "generation_s": gen_s,
            "generations_per_s": 1.0 / gen_s, "tasks_per_generation": tasks,
            "eval_work_s": eval_work, "update_s": update_s, "overhead_s": overhead,
            "env_steps_per_s": statistics.median(
                (b["env_steps"] - a["env_steps"]) / (b["wall_s"] - a["wall_s"])
                for a, b in zip(gens[1:], gens[2:]))}


class _StopAfter:
    """A progress callback that ends the run after ``n`` generations by raising."""

    def __init__(self, n: int):
        self.n = n
        self.seen = 0

    def __call__(self, info: dict) -> None:
        self.seen += 1
        if self.seen >= self.n:
            raise _Done()


class _Done(Exception):
    pass


def project(m: dict, workers: int, pairs: int, pairs_per_task: int) -> dict:
    """Generation time on ``workers`` workers, scaling the population with the workers."""
    tasks = max(workers, pairs // pairs_per_task)
    per_task_work = m["eval_work_s"] / m["tasks_per_generation"]
    eval_s = per_task_work * tasks / workers
    scheduler_s = tasks / SCHEDULER_TASKS_PER_S
    fixed_s = m["overhead_s"]
    update_s = m["update_s"] * tasks / m["tasks_per_generation"]  # weighted sum grows with N
    total = eval_s + scheduler_s + fixed_s + update_s
    terms = {"evaluation": eval_s, "scheduler": scheduler_s, "driver": fixed_s,
             "update": update_s}
    return {"workers": workers, "population": 2 * pairs_per_task * tasks,
            "generation_s": total, "generations_per_s": 1 / total,
            "efficiency": eval_s / total, "limited_by": max(terms, key=terms.get), **terms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--pairs-per-task", type=int, default=4)
    ap.add_argument("--out", default=str(HERE / "results" / "es_scaling.json"))
    args = ap.parse_args()
    measured = []
    for workers in (1, 2):
        m = measure(workers, args.generations, args.pairs, args.pairs_per_task)
        measured.append(m)
        print(f"{workers} worker(s): {m['generations_per_s']:.2f} generations/s, "
              f"{m['env_steps_per_s']:.0f} env steps/s, update {m['update_s'] * 1e3:.1f} ms, "
              f"overhead {m['overhead_s'] * 1e3:.0f} ms/generation", flush=True)
    speedup = measured[1]["generations_per_s"] / measured[0]["generations_per_s"]
    print(f"speed-up 1 -> 2 workers: {speedup:.2f}x")
    base = measured[-1]
    projection = [project(base, w, args.pairs, args.pairs_per_task)
                  for w in (2, 32, 128, 1024)]
    print("\nProjection (a model from the 2-worker measurements, not a measurement):")
    print("| workers | population | generation s | generations/s | efficiency | limited by |")
    print("|---|---|---|---|---|---|")
    for p in projection:
        print(f"| {p['workers']} | {p['population']} | {p['generation_s']:.3f} | "
              f"{p['generations_per_s']:.2f} | {p['efficiency']:.2f} | {p['limited_by']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"measured": measured, "speedup_1_to_2": speedup,
                                          "projection": projection}, indent=2))
    from stats import record_commit
    record_commit(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
