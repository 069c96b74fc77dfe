"""Where a task's time goes: the engine's fixed cost per rollout and learner task, measured
in a real training run.

The README's main job (``pipelines/ppo_cartpole.yaml``: PPO, ``async``, 2 learners, 512
samples per rollout) trains for ``--env-steps`` on an embedded LocalCluster of 1 and of 2
single-threaded worker processes, evaluations off (no target), the weights moving as in any
run. Four clocks, all ``time.time()`` on this one machine:

- the driver: when it submitted each task, when its loop took the finished future, how long
  the part's handler ran (wrappers around ``InFlight.hold`` and ``Driver._handle``, in this
  process only);
- the scheduler: Dask's task stream, when each task's compute started and stopped on its
  worker, and any transfer of its input from another worker;
- the task itself: a rollout's pull and collection, a learner's pull, learning and push (the
  ``Trajectory`` and ``LearnerReport`` they return);
- the processes' CPU: user + system seconds of every thread of the driver's process (the
  driver's thread; the event loop that runs the embedded scheduler and the client's comms)
  and of each worker process (the one holding the parameter actor named), over the training
  window (first rollout submitted to the run's finishing).

So per task: latency to start (submitted -> compute start), the work, the engine's part of the
task's compute (pull, push, (de)serialisation), latency back (compute stop -> the driver's
loop) and the driver's handling; and per env step, the CPU each process spent, against the
CPU the work itself took. A plain process spends only the work.

    python benchmarks/task_cost.py --env-steps 100000 --repeats 3 [--profile]
        [--variants 'learner.fused=true;learner.fused=false']

A fused task (``learner.fused``: collect and learn in one task) is its own kind: its engine
share is everything but the collection and the learning (the rollout's pull, the learner's
pull and push); its latency to start is left out, since a queued one is submitted early on
purpose. Each worker's busy share (its compute spans over the window) and its idle gaps
between two tasks say how much of the cores the engine leaves unused.

``--profile`` also samples every process with py-spy (``pip install py-spy``) for the first
repeat and lists each one's top functions by own time. Writes
``benchmarks/results/task_cost.json`` (with the commit it ran on).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PIPELINE = ROOT / "pipelines" / "ppo_cartpole.yaml"
KINDS = ("rollout", "learner", "fused")


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


class _Trace:
    """The driver's clock: submitted, taken and handled, per task key."""

    def __init__(self) -> None:
        self.submitted: dict[str, tuple[str, float]] = {}
        self.taken: dict[str, tuple[float, float]] = {}
        self.reports: list = []
        self.collect_s: list[float] = []
        self.rollout_pull_s: list[float] = []
        self.first_submit: float | None = None
        self.on_first_submit = None

    def install(self):
        from dask_rl.runtime import driver as driver_mod
        from dask_rl.runtime.inflight import InFlight

        trace = self
        hold, handle = InFlight.hold, driver_mod.Driver._handle

        def traced_hold(inflight, fut, kind, done, **task):
            now = time.time()
            if kind == "learner" and task.get("slot") is not None:
                kind = "fused"   # collects on its slot and learns there (learner.fused)
            if trace.first_submit is None and kind in KINDS:
                trace.first_submit = now
                trace.on_first_submit()
            trace.submitted[fut.key] = (kind, now)
            if kind in ("learner", "fused"):   # its report has the task's own clocks
                def done_traced(result, t, _done=done, _kind=kind):
                    trace.reports.append((_kind, result))
                    _done(result, t)
                done = done_traced
            return hold(inflight, fut, kind, done, **task)

        def traced_handle(driver, fut, task):
            t0 = time.time()
            handle(driver, fut, task)
            trace.taken[fut.key] = (t0, time.time() - t0)

        InFlight.hold, driver_mod.Driver._handle = traced_hold, traced_handle

        def restore():
            InFlight.hold, driver_mod.Driver._handle = hold, handle
        return restore


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by role: the driver (this thread) and the rest
    (the event loop of the embedded scheduler and the client, and helpers)."""
    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out: dict[str, float] = collections.defaultdict(float)
    for t in psutil.Process().threads():
        role = "driver" if t.id == main else names.get(t.id, "other")
        role = "event loop" if "IO loop" in role or "loop" in role.lower() else role
        role = role if role in ("driver", "event loop") else "other threads"
        out[role] += t.user_time + t.system_time
    return dict(out)


def _py_spy(pids: dict[str, int], seconds: float, out: Path) -> list:
    procs = []
    for name, pid in pids.items():
        path = out / f"{name.replace(' ', '_')}.txt"
        procs.append((name, path, subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)),
             "--rate", "200", "--format", "raw", "--output", str(path), "--nonblocking",
             "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return procs


def _top_functions(path: Path, n: int = 12) -> dict:
    """Own-time shares of a py-spy raw (collapsed) profile, and its sample count."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    if not path.exists():
        return {"samples": 0, "top": []}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        c = int(count)
        total += c
        leaf = frames[-1]
        own[leaf.split(" (")[0] + " (" + leaf.split(" (")[-1] if " (" in leaf else leaf] += c
    return {"samples": total,
            "top": [[f, round(c / max(total, 1), 3)] for f, c in own.most_common(n)]}


def run_once(workers: int, env_steps: int, seed: int, profile_dir: Path | None,
             extra: list[str] = ()) -> dict:
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    import dask_rl
    from dask_rl.api import resolve
    from dask_rl.runtime.cluster import connect
    from dask_rl.runtime.hooks import RunHooks

    cfg = resolve(str(PIPELINE), [f"stop.env_steps={env_steps}", f"seed={seed}",
                                  "stop.target_return=1e9", "stop.eval_every_updates=0",
                                  "checkpoint.every_s=1e9", f"cluster.n_workers={workers}",
                                  *extra])
    t0 = time.time()
    trace = _Trace()
    marks: dict = {}
    with connect(cfg.cluster) as client:
        started = time.time() - t0
        sched = client.cluster.scheduler
        stream = TaskStreamPlugin(sched)
        sched.add_plugin(stream, name="task-cost-stream")
        pids = client.run(os.getpid)
        profilers: list = []

        def mark(label):
            marks[label] = {"t": time.time(), "driver_threads": _threads_cpu(),
                            "driver_process": _cpu(os.getpid()),
                            "workers": {a: _cpu(p) for a, p in pids.items()}}

        def first_submit():
            mark("start")
            if profile_dir is not None:
                est = env_steps / (9_000 * workers) * 0.9
                profilers.extend(_py_spy({"driver": os.getpid(), **{
                    f"worker {i}": p for i, p in enumerate(pids.values())}}, est, profile_dir))
        trace.on_first_submit = first_submit

        class Hooks(RunHooks):
            def finishing(self, run):
                mark("end")
                marks["actor_worker"] = run.supervisor.address

        restore = trace.install()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                result = dask_rl.train(cfg, client=client, run_dir=Path(tmp) / "run",
                                       hooks=Hooks())
        finally:
            restore()
        records = list(stream.buffer)
        for _, _, p in profilers:
            p.wait(timeout=120)
    started = {"cluster_s": started, "to_first_rollout_s": trace.first_submit - t0}
    return _analyse(workers, env_steps, seed, started, trace, marks, records, pids,
                    [marks["actor_worker"]], result.summary, profilers)


def _analyse(workers, env_steps, seed, started, trace, marks, records, pids, actor_workers,
             summary, profilers) -> dict:
    t_start, t_end = marks["start"]["t"], marks["end"]["t"]
    window = t_end - t_start
    compute: dict[str, tuple[float, float, float]] = {}
    spans: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for r in records:
        key = r["key"]
        comp = [s for s in r["startstops"] if s["action"] == "compute"]
        xfer = sum(s["stop"] - s["start"] for s in r["startstops"] if s["action"] == "transfer")
        if comp:
            compute[key] = (comp[0]["start"], comp[-1]["stop"], xfer)
            if t_start <= comp[0]["start"] and comp[-1]["stop"] <= t_end:
                spans[r["worker"]].append((comp[0]["start"], comp[-1]["stop"]))
    per_kind: dict[str, dict[str, list[float]]] = {k: collections.defaultdict(list) for k in KINDS}
    for key, (kind, submitted) in trace.submitted.items():
        if kind not in KINDS or key not in compute or key not in trace.taken:
            continue
        start, stop, xfer = compute[key]
        if not (t_start <= submitted and stop <= t_end):
            continue
        taken, handler = trace.taken[key]
        p = per_kind[kind]
        # a queued fused task is submitted early on purpose: its latency to start says nothing
        if kind != "fused":
            p["to_start_ms"].append(1e3 * (start - submitted))
        p["compute_ms"].append(1e3 * (stop - start))
        p["transfer_ms"].append(1e3 * xfer)
        p["back_ms"].append(1e3 * (taken - stop))
        p["handler_ms"].append(1e3 * handler)
    learners = [r for kind, r in trace.reports if kind == "learner"]
    fused = [r for kind, r in trace.reports if kind == "fused"]
    lr, ro, fu = per_kind["learner"], per_kind["rollout"], per_kind["fused"]
    lr["pull_ms"] = [1e3 * r.pull_s for r in learners]
    lr["push_ms"] = [1e3 * r.push_s for r in learners]
    lr["learn_ms"] = [1e3 * (r.task_s - r.pull_s - r.push_s) for r in learners]
    ro["collect_ms"] = [1e3 * r.collect_s for r in learners]   # each learner's trajectory
    # (the trajectory's pull time is recorded since 9bdf558; older commits leave it out)
    ro["pull_ms"] = [1e3 * r.rollout_pull_s for r in learners if hasattr(r, "rollout_pull_s")]
    fu["collect_ms"] = [1e3 * r.collect_s for r in fused]
    fu["rollout_pull_ms"] = [1e3 * r.rollout_pull_s for r in fused]
    fu["pull_ms"] = [1e3 * r.pull_s for r in fused]
    fu["push_ms"] = [1e3 * r.push_s for r in fused]
    fu["learn_ms"] = [1e3 * (r.task_s - r.pull_s - r.push_s) for r in fused]
    # each worker: the share of the window it computed, and its idle gaps between two tasks
    busy, gaps = {}, []
    for worker, ss in spans.items():
        ss.sort()
        busy[worker.rsplit(":", 1)[-1]] = round(sum(b - a for a, b in ss) / window, 3)
        gaps += [1e3 * max(0.0, b[0] - a[1]) for a, b in zip(ss, ss[1:])]

    def mean(xs):
        return round(statistics.fmean(xs), 3) if xs else None

    tasks = {k: {name: mean(v) for name, v in sorted(p.items())} | {"n": len(p["compute_ms"])}
             for k, p in per_kind.items()}
    tasks = {k: t for k, t in tasks.items() if t["n"]}
    for k, t in tasks.items():   # the engine's share of the compute: all but the work itself
        work = {"rollout": [t.get("collect_ms")], "learner": [t.get("learn_ms")],
                "fused": [t.get("collect_ms"), t.get("learn_ms")]}[k]
        t["engine_in_compute_ms"] = (round(t["compute_ms"] - sum(work), 3)
                                     if None not in work else None)
    a, b = marks["start"], marks["end"]
    cpu = {f"driver process: {role}": b["driver_threads"].get(role, 0.0)
           - a["driver_threads"].get(role, 0.0) for role in b["driver_threads"]}
    for addr in pids:
        label = "worker (parameter actor)" if addr in actor_workers else "worker"
        cpu[f"{label} {addr.rsplit(':', 1)[-1]}"] = b["workers"][addr] - a["workers"][addr]
    steps = summary["env_steps"]
    n_ro, n_le = len(ro["collect_ms"]) + len(fused), len(learners) + len(fused)
    work_s = (sum(ro["collect_ms"]) + sum(lr["learn_ms"]) + sum(fu["collect_ms"])
              + sum(fu["learn_ms"])) / 1e3
    total_cpu = sum(cpu.values())
    return {
        "workers": workers, "seed": seed, "env_steps": steps,
        "cluster_start_s": round(started["cluster_s"], 3),
        "start_to_first_rollout_s": round(started["to_first_rollout_s"], 3),
        "window_s": round(window, 3), "env_steps_per_s": round(steps / window, 1),
        "tasks": tasks,
        "worker_busy_share": busy,
        "worker_gap_ms": {"mean": mean(gaps), "median": (round(statistics.median(gaps), 3)
                                                          if gaps else None), "n": len(gaps)},
        "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_total_s": round(total_cpu, 3), "cores_busy": round(total_cpu / window, 3),
        "work_cpu_s": round(work_s, 3),
        "engine_cpu_s": round(total_cpu - work_s, 3),
        "engine_cpu_ms_per_rollout": round(1e3 * (total_cpu - work_s) / max(n_ro, 1), 3),
        "rollouts": n_ro, "learners": n_le,
        "summary": {k: summary.get(k) for k in ("env_steps", "updates", "wall_s",
                                                "mean_staleness", "learner_time_share",
                                                "rollout_time_share")},
        "profile": {name: _top_functions(path) for name, path, _ in profilers},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env-steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seed", type=int, default=401)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a pipeline override for every run (recorded in the results)")
    ap.add_argument("--variants", default="",
                    help="sides that differ only in these overrides, ';' between sides, ',' "
                         "within one (e.g. 'learner.fused=true;learner.fused=false'); "
                         "every side runs in each repeat, turns rotating")
    ap.add_argument("--out", default=str(HERE / "results" / "task_cost.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    runs = []
    sizes = [int(w) for w in args.workers.split(",")]
    variants = [[o for o in v.split(",") if o] for v in args.variants.split(";")]
    sides = [(w, v) for w in sizes for v in variants]
    for rep in range(args.repeats):
        k = rep % len(sides)
        for w, variant in sides[k:] + sides[:k]:   # interleaved, turns rotating
            prof = None
            if args.profile and rep == 0:
                prof = Path(tempfile.mkdtemp(prefix=f"task-cost-{w}-"))
            r = run_once(w, args.env_steps, args.seed + rep, prof, [*args.set, *variant])
            r["variant"] = variant
            runs.append(r)
            print(json.dumps({k: r[k] for k in ("workers", "variant", "env_steps_per_s",
                                                "cores_busy", "worker_busy_share",
                                                "worker_gap_ms", "engine_cpu_ms_per_rollout",
                                                "cluster_start_s", "start_to_first_rollout_s")}),
                  flush=True)
            for k, t in r["tasks"].items():
                print(f"  {k}: {t}", flush=True)
            print(f"  cpu: {r['cpu_s']}", flush=True)
    out = {"benchmark": "task_cost", "commit": _commit(), "pipeline": str(PIPELINE.name),
           "config": {"env_steps": args.env_steps, "repeats": args.repeats,
                      "workers": sizes, "variants": variants,
                      "seeds": [args.seed + i for i in range(args.repeats)],
                      "overrides": ["stop.target_return=1e9", "stop.eval_every_updates=0",
                                    "checkpoint.every_s=1e9", *args.set]},
           "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
           "runs": runs}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
