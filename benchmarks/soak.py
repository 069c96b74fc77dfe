"""Soak: a long asynchronous CartPole run under load, watched for leaks and lost work.

32 rollout tasks in flight and 8 concurrent learners on 2 worker processes (2 threads each)
for ``--minutes`` (default 20). Every ``--sample-s`` seconds it records the driver's RSS, each
worker's memory, the scheduler's task count, the rate of metrics records (each one also a
Dask event) and the checkpoints' size on disk. At the end it checks that memory stayed flat
after warm-up (growth below ``--max-growth-mb``), that the scheduler's task count did not
grow, and that every trajectory produced was learned from or deliberately dropped (and
counted).

    python benchmarks/soak.py --minutes 20

Writes ``benchmarks/results/soak.{json,md,png}``; exit code 1 if a bound is violated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPELINE = HERE.parent / "pipelines" / "ppo_cartpole.yaml"


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def soak(minutes: float, sample_s: float, workdir: Path, dask_profiler: bool = False) -> dict:
    import dask
    import psutil
    from distributed import Client, LocalCluster

    import dask_rl

    me = psutil.Process(os.getpid())
    samples: list[dict] = []
    run_dir = workdir / "soak"
    # As dask-rl's embedded clusters do (cluster.profile: false): Dask's statistical profiler
    # keeps 1,000 one-second cycles of call trees per worker, ~110 MB here, which grow for the
    # first ~17 minutes of a run before they plateau (measured with --dask-profiler).
    with dask.config.set({"distributed.worker.profile.enabled": dask_profiler}), \
            LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                         silence_logs=50) as cluster, Client(cluster) as client:
        stop = threading.Event()
        t0 = time.time()

        def watch():
            last_events, last_t = 0, time.time()
            while not stop.wait(sample_s):
                workers = client.run(lambda: psutil.Process().memory_info().rss)
                tasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
                lines = sum(1 for _ in open(run_dir / "metrics.jsonl")) \
                    if (run_dir / "metrics.jsonl").exists() else 0
                now = time.time()
                samples.append({
                    "t": now - t0, "driver_rss_mb": me.memory_info().rss / 2**20,
                    "worker_rss_mb": {k: v / 2**20 for k, v in workers.items()},
                    "scheduler_tasks": tasks, "events_per_s": (lines - last_events)
                    / (now - last_t), "records": lines,
                    "checkpoint_mb": _dir_bytes(run_dir / "checkpoints") / 2**20})
                last_events, last_t = lines, now

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = dask_rl.train(PIPELINE, client=client, run_dir=run_dir, overrides=[
            "rollout.slots=32", "rollout.max_ready=16", "learner.max_learners=8",
            f"stop.wall_s={minutes * 60}", "stop.env_steps=1000000000",
            "stop.solve_on_target=false", "learner.anneal_lr=false", "checkpoint.every_s=30",
            "stop.eval_every_updates=200"])
        stop.set()
        watcher.join()
    return {"summary": result.summary, "samples": samples}


def check(data: dict, max_growth_mb: float) -> dict:
    samples = data["samples"]
    warm = [s for s in samples if s["t"] >= samples[-1]["t"] * 0.25] or samples
    first, last = warm[0], warm[-1]
    growth = {"driver": last["driver_rss_mb"] - first["driver_rss_mb"]}
    for w in last["worker_rss_mb"]:
        if w in first["worker_rss_mb"]:
            growth[w] = last["worker_rss_mb"][w] - first["worker_rss_mb"][w]
    s = data["summary"]
    accounted = s["trajectories_consumed"] + s["dropped_trajectories"]
    tasks = [x["scheduler_tasks"] for x in warm]
    return {"memory_growth_mb": growth,
            "memory_flat": all(g < max_growth_mb for g in growth.values()),
            "scheduler_tasks_max_first_half": max(tasks[:len(tasks) // 2 or 1]),
            "scheduler_tasks_max_second_half": max(tasks[len(tasks) // 2:] or tasks),
            "no_backlog_growth": max(tasks[len(tasks) // 2:] or tasks)
            <= 1.5 * max(tasks[:len(tasks) // 2 or 1]) + 20,
            "trajectories_produced": s["trajectories_produced"],
            "trajectories_accounted": accounted,
            "nothing_lost": s["trajectories_produced"] == accounted,
            "events_per_s_median": statistics.median(x["events_per_s"] for x in samples[1:])
            if len(samples) > 1 else 0.0}


def report(data: dict, verdict: dict, out: Path) -> str:
    s = data["summary"]
    rows = ["| minute | driver RSS MB | worker RSS MB | scheduler tasks | records/s | "
            "checkpoints MB |", "|---|---|---|---|---|---|"]
    step = max(1, len(data["samples"]) // 20)
    for x in data["samples"][::step]:
        workers = " / ".join(f"{v:.0f}" for v in x["worker_rss_mb"].values())
        rows.append(f"| {x['t'] / 60:.1f} | {x['driver_rss_mb']:.0f} | {workers} | "
                    f"{x['scheduler_tasks']} | {x['events_per_s']:.1f} | "
                    f"{x['checkpoint_mb']:.2f} |")
    md = "\n".join(rows) + "\n\n" + "\n".join([
        f"- run: {s['env_steps']} env steps learned, {s['updates']} updates, "
        f"{s['wall_s']:.0f} s, final greedy return {s['final_return']:.1f}",
        "- memory growth after warm-up (MB): "
        + ", ".join(f"{k.rsplit(':', 1)[-1]} {v:+.1f}" for k, v in
                    verdict["memory_growth_mb"].items())
        + f" -> flat: {verdict['memory_flat']}",
        f"- scheduler tasks, max first / second half: "
        f"{verdict['scheduler_tasks_max_first_half']} / "
        f"{verdict['scheduler_tasks_max_second_half']} -> no backlog growth: "
        f"{verdict['no_backlog_growth']}",
        f"- trajectories produced {verdict['trajectories_produced']}, learned + dropped "
        f"{verdict['trajectories_accounted']} (dropped {s['dropped_trajectories']}, "
        f"unfinished rollouts cancelled at the end {s['cancelled_rollouts']}) -> nothing lost: "
        f"{verdict['nothing_lost']}"])
    _plot(data, out.with_suffix(".png"))
    return md


def _plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = data["samples"]
    t = [x["t"] / 60 for x in samples]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    axes[0].plot(t, [x["driver_rss_mb"] for x in samples], label="driver")
    for w in samples[-1]["worker_rss_mb"]:
        axes[0].plot(t, [x["worker_rss_mb"].get(w) for x in samples],
                     label=w.rsplit(":", 1)[-1])
    axes[0].set_title("RSS (MB)")
    axes[0].legend(fontsize=7)
    axes[1].plot(t, [x["scheduler_tasks"] for x in samples])
    axes[1].set_title("scheduler tasks")
    axes[2].plot(t, [x["events_per_s"] for x in samples])
    axes[2].set_title("metrics records / s")
    for ax in axes:
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--max-growth-mb", type=float, default=64.0)
    ap.add_argument("--dask-profiler", action="store_true",
                    help="keep Dask's statistical profiler on (its history grows ~110 MB/worker)")
    ap.add_argument("--out", default=str(HERE / "results" / "soak"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = soak(args.minutes, args.sample_s, Path(tmp), dask_profiler=args.dask_profiler)
    verdict = check(data, args.max_growth_mb)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    md = report(data, verdict, out)
    print(md)
    out.with_suffix(".md").write_text(md + "\n")
    out.with_suffix(".json").write_text(json.dumps({"verdict": verdict, **data}, indent=1))
    ok = verdict["memory_flat"] and verdict["no_backlog_growth"] and verdict["nothing_lost"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
