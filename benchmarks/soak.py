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

``--pipeline NAME`` soaks one of the shipped pipelines instead (``ppo_async``, ``stellaris``,
``dqn_replay``, see ``PIPELINES``) on its own embedded cluster for ``--minutes``, with solving
switched off and an env-step budget no run reaches, so the wall budget ends it. Every
``--sample-s`` seconds it records the RSS of the driver (which hosts the embedded cluster's
scheduler and nannies) and of each of its descendant processes, by pid. After dropping
``--warmup-min`` minutes it fits each process's RSS slope (MB/h) by least squares, with a 95%
interval corrected for autocorrelation by an effective sample size (``slope_fit``): successive
samples of one process's memory are correlated, and the textbook OLS interval, which assumes
they are not, is too narrow (it is reported too, with Newey-West's, for comparison). Memory
counts as flat only where the corrected interval holds 0.

    python benchmarks/soak.py --pipeline dqn_replay --minutes 65 --sample-s 20

writes ``benchmarks/results/soak_<name>.{json,md}``; ``--table A.json B.json ...`` writes one
markdown table of several such runs. Exit code 0 either way: the slopes are the result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
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


PIPES = HERE.parent / "pipelines"
# What every pipeline soak overrides: wall time ends the run, nothing else.
FOREVER = ["stop.env_steps=1000000000", "stop.solve_on_target=false"]
PIPELINES = {
    # The 20-minute soak's load: 32 rollouts in flight, 8 learners, 2 threads per worker.
    "ppo_async": (PIPES / "ppo_cartpole.yaml", [
        "rollout.slots=32", "rollout.max_ready=16", "learner.max_learners=8",
        "cluster.threads_per_worker=2", "learner.anneal_lr=false",
        "stop.eval_every_updates=200"]),
    "stellaris": (PIPES / "ppo_cartpole_stellaris.yaml", ["learner.anneal_lr=false"]),
    "dqn_replay": (PIPES / "dqn_cartpole.yaml", []),
}


def _role(proc) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:   # gone, or not ours to read
        return "process"
    if "resource_tracker" in cmd:
        return "resource_tracker"
    if "spawn_main" in cmd or "forkserver" in cmd:
        return "worker"
    return proc.name()


def rss_by_process(me) -> dict[str, float]:
    """RSS (MB) of ``me`` and each of its descendants, keyed ``role pid``."""
    out = {f"driver {me.pid}": me.memory_info().rss / 2**20}
    for child in me.children(recursive=True):
        try:
            out[f"{_role(child)} {child.pid}"] = child.memory_info().rss / 2**20
        except Exception:   # exited between the listing and the read
            continue
    return out


def pipeline_soak(name: str, minutes: float, sample_s: float, run_dir: Path,
                  extra: list[str] | None = None) -> dict:
    """Train pipeline ``name`` for ``minutes`` on its own cluster, sampling every process's RSS."""
    import psutil

    import dask_rl
    from dask_rl.api import resolve
    from dask_rl.config import to_dict

    path, overrides = PIPELINES[name]
    overrides = [*overrides, *FOREVER, f"stop.wall_s={minutes * 60}", *(extra or [])]
    config = to_dict(resolve(path, overrides))
    me = psutil.Process(os.getpid())
    samples: list[dict] = []
    stop = threading.Event()
    t0 = time.time()

    def watch():
        while True:
            metrics = run_dir / "metrics.jsonl"
            samples.append({"t": time.time() - t0, "rss_mb": rss_by_process(me),
                            "records": sum(1 for _ in open(metrics)) if metrics.exists() else 0})
            if stop.wait(sample_s):
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = dask_rl.train(path, run_dir=run_dir, overrides=overrides)
    finally:
        stop.set()
        watcher.join()
    return {"pipeline": name, "pipeline_file": str(path.relative_to(HERE.parent)),
            "overrides": overrides, "config": config, "summary": result.summary,
            "sample_s": sample_s, "samples": samples}


def slope_fit(t_s: list[float], y: list[float], lags: int | None = None) -> dict:
    """Least-squares slope of ``y`` (MB) against ``t_s`` (seconds), in MB/h, with 95% intervals.

    RSS samples taken seconds apart are autocorrelated, and the plain OLS interval
    (``ci95_ols``) then claims far more certainty than the data hold. ``ci95``, the one the
    verdict uses, corrects it for an effective sample size: with r1 the lag-1 autocorrelation
    of the residuals (floored at 0), n_eff = n (1 - r1) / (1 + r1), the OLS standard error
    scaled by sqrt((n - 2) / (n_eff - 2)) and Student's t with n_eff - 2 df. ``ci95_nw`` is the
    Newey-West (Bartlett, ``lags`` lags, default floor(sqrt(n))) interval, for comparison: on
    AR(1) noise at n = 165 it covers the true slope less often than it claims
    (``--coverage`` measures all three).
    """
    from scipy import stats

    n = len(y)
    x = [ti / 3600.0 for ti in t_s]
    xm, ym = sum(x) / n, sum(y) / n
    dx = [xi - xm for xi in x]
    sxx = sum(d * d for d in dx)
    b = sum(d * (yi - ym) for d, yi in zip(dx, y)) / sxx
    a = ym - b * xm
    e = [yi - a - b * xi for xi, yi in zip(x, y)]
    sse = sum(r * r for r in e)
    se_ols = math.sqrt(sse / (n - 2) / sxx)
    r1 = max(0.0, sum(e[i] * e[i - 1] for i in range(1, n)) / sse) if sse > 0 else 0.0
    n_eff = max(3.0, n * (1 - r1) / (1 + r1))
    se_eff = se_ols * math.sqrt((n - 2) / (n_eff - 2))
    lags = int(math.sqrt(n)) if lags is None else lags
    u = [d * r for d, r in zip(dx, e)]
    s = sum(v * v for v in u)
    for lag in range(1, min(lags, n - 1) + 1):
        s += 2 * (1 - lag / (lags + 1)) * sum(u[i] * u[i - lag] for i in range(lag, n))
    se_nw = math.sqrt(max(s, 0.0)) / sxx * math.sqrt(n / (n - 2))
    q = float(stats.t.ppf(0.975, n - 2))
    q_eff = float(stats.t.ppf(0.975, n_eff - 2))
    ci = [b - q_eff * se_eff, b + q_eff * se_eff]
    return {"n": n, "slope_mb_per_h": b, "ci95": ci, "n_eff": n_eff,
            "residual_lag1_autocorr": r1, "ci95_ols": [b - q * se_ols, b + q * se_ols],
            "ci95_nw": [b - q * se_nw, b + q * se_nw], "nw_lags": lags,
            "start_mb": a + b * x[0], "end_mb": a + b * x[-1],
            "flat": bool(ci[0] <= 0.0 <= ci[1])}


def coverage(n: int = 165, step_s: float = 20.0, reps: int = 1000, seed: int = 0) -> dict:
    """How often each of ``slope_fit``'s intervals holds the true slope (0) on AR(1) noise."""
    import random

    rng = random.Random(seed)
    out = {}
    for phi in (0.0, 0.5, 0.8, 0.9, 0.95):
        held = {"ci95": 0, "ci95_nw": 0, "ci95_ols": 0}
        for _ in range(reps):
            v, y = 0.0, []
            for i in range(n + 200):   # 200 steps of burn-in to reach the stationary law
                v = phi * v + rng.gauss(0.0, 1.0)
                if i >= 200:
                    y.append(v)
            f = slope_fit([i * step_s for i in range(n)], y)
            for k in held:
                held[k] += f[k][0] <= 0.0 <= f[k][1]
        out[phi] = {k: c / reps for k, c in held.items()}
    return out


def slopes(data: dict, warmup_min: float, min_samples: int = 10) -> dict:
    """Each process's slope after warm-up; processes sampled fewer times are listed, not fitted."""
    warm = [s for s in data["samples"] if s["t"] >= warmup_min * 60]
    out = {}
    for proc in dict.fromkeys(k for s in data["samples"] for k in s["rss_mb"]):
        pts = [(s["t"], s["rss_mb"][proc]) for s in warm if proc in s["rss_mb"]]
        if len(pts) < min_samples:
            out[proc] = {"n": len(pts), "slope_mb_per_h": None,
                         "note": "too few samples after warm-up (a short-lived process)"}
            continue
        out[proc] = slope_fit([p[0] for p in pts], [p[1] for p in pts])
    return out


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE.parent, capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:   # no git, or a copy without .git
        return None


def pipeline_rows(data: dict) -> list[str]:
    rows = []
    for proc, f in data["slopes"].items():
        if f["slope_mb_per_h"] is None:
            continue
        lo, hi = f["ci95"]
        rows.append(f"| {data['pipeline']} | {proc} | {f['start_mb']:.0f} -> {f['end_mb']:.0f} | "
                    f"{f['slope_mb_per_h']:+.1f} | [{lo:+.1f}, {hi:+.1f}] | "
                    f"{'yes' if f['flat'] else '**no**'} |")
    return rows


TABLE_HEAD = ["| pipeline | process | fitted RSS MB (after warm-up -> end) | slope MB/h | "
              "95% CI (n_eff-corrected) | flat (CI holds 0) |", "|---|---|---|---|---|---|"]


def pipeline_report(data: dict) -> str:
    s = data["summary"]
    return "\n".join(TABLE_HEAD + pipeline_rows(data)) + "\n\n" + "\n".join([
        f"- pipeline `{data['pipeline_file']}` with `{' '.join(data['overrides'])}`",
        f"- commit {data['commit']} ({data['commit_note']})",
        f"- {data['minutes']} min, samples every {data['sample_s']} s, first "
        f"{data['warmup_min']} min dropped; {s.get('env_steps')} env steps, {s.get('updates')} "
        f"updates, stop reason {s.get('stop_reason')}"])


def write_table(paths: list[str], out: Path) -> str:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    md = "\n".join(TABLE_HEAD + [r for d in runs for r in pipeline_rows(d)]) + "\n"
    out.write_text(md)
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--max-growth-mb", type=float, default=64.0)
    ap.add_argument("--dask-profiler", action="store_true",
                    help="keep Dask's statistical profiler on (its history grows ~110 MB/worker)")
    ap.add_argument("--out", default=None,
                    help="output path without suffix (default benchmarks/results/soak[_NAME])")
    ap.add_argument("--pipeline", choices=sorted(PIPELINES),
                    help="soak this pipeline and fit each process's RSS slope")
    ap.add_argument("--warmup-min", type=float, default=10.0,
                    help="--pipeline: minutes dropped before the slope fit")
    ap.add_argument("--run-dir", default=None, help="--pipeline: the run's directory "
                    "(default: a temporary one)")
    ap.add_argument("--commit", default=None, help="the commit the code under test is on "
                    "(default: git rev-parse HEAD here)")
    ap.add_argument("--commit-note", default="", help="how the tree differs from --commit")
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="write one markdown table of these pipeline soaks to --out.md")
    ap.add_argument("--coverage", action="store_true",
                    help="print how often each slope interval holds 0 on AR(1) noise")
    ap.add_argument("overrides", nargs="*", help="--pipeline: extra key=value overrides")
    args = ap.parse_args()
    if args.coverage:
        print(json.dumps(coverage(), indent=1))
        return 0
    if args.table:
        out = Path(args.out or HERE / "results" / "soak_pipelines")
        print(write_table(args.table, out.with_suffix(".md")))
        return 0
    if args.pipeline:
        out = Path(args.out or HERE / "results" / f"soak_{args.pipeline}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
            data = pipeline_soak(args.pipeline, args.minutes, args.sample_s, run_dir,
                                 args.overrides)
        data.update(minutes=args.minutes, warmup_min=args.warmup_min,
                    commit=args.commit or _git_commit(), commit_note=args.commit_note,
                    python=platform.python_version(), cpus=os.cpu_count())
        data["slopes"] = slopes(data, args.warmup_min)
        out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
        md = pipeline_report(data)
        out.with_suffix(".md").write_text(md + "\n")
        print(md)
        return 0
    if args.overrides:
        ap.error("key=value overrides go with --pipeline")
    args.out = args.out or str(HERE / "results" / "soak")
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
