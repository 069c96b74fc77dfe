"""The parameter service under load: calls per second, latency and where the actor's time goes.

The real :class:`~dask_rl.runtime.parameter_actor.ParameterActor` runs as a Dask actor alone on
worker A of a ``LocalCluster`` of three worker processes. K learners and K samplers run as
threads (long-running tasks) on workers B and C, alternating, and call it through
:class:`~dask_rl.runtime.handle.ActorHandle` exactly as training's tasks do:

* a **learner** loops ``pull_learner`` (parameters, and the learners' Adam moments unless
  they stay with the learner) -> ``--work-ms`` of sleep (tiny learner work, so that the
  service is the bottleneck) -> ``push`` (a delta, and Adam moments unless they stay, of the
  model's size, float32, exactly-once sequence numbers), with the ``async`` strategy (every
  push is an update);
* a **sampler** loops ``pull(newer_than=held)`` (parameters only when the version moved) ->
  ``--sample-ms`` of sleep (a rollout).

Payloads are the real models' sizes: the MLP of ``pipelines/ppo_cartpole.yaml`` and the
Nature CNN of ``pipelines/ppo_pong.yaml``. Four paths (``--paths``), side by side per K:
``uncombined`` (one actor call per call, moments with the actor: the path before this work),
``combined`` (call combining, moments with the actor), ``combined-local`` (call combining,
``learner.optimizer_state = local``: moments stay with the learners) and ``direct`` (call
combining, trips over the actor's direct channel: ``cluster.actor_transport = direct``).
For each model and K (``--learners``: 1, 4, 16, 64), after ``--warmup-s`` the script counts
``--window-s`` seconds:
pushes/s, learner pulls/s, sampler pulls/s (and how many carried parameters), p50/p99
latency of each kind of call, and the CPU seconds each process spent (the actor's worker
against the callers' workers and the scheduler: on this machine's 2 cores the callers compete
with the actor, which the CPU column makes visible instead of hiding). The service's
**capacity** is the calls it served per second of its own worker's CPU (pushes, learner pulls
and sampler pulls over the actor's CPU seconds per second), set beside the uncombined path's
at the same K: wall rates on 2 cores also measure how much CPU the callers left it.

Where the time goes: a separate window per model (K = ``--profile-k``, so that sampling does
not slow the timed windows) samples every thread's stack on the actor's worker every
``--profile-ms`` with ``sys._current_frames`` and files each sample under the innermost
frame that names a cause: the update math (numpy inside the actor's methods), waiting for
the actor's lock, serialisation (pickle, Dask's protocol), the network (Dask's comm layer),
the event loop's own work, or idle (a thread blocked waiting for work). The share of busy
samples per cause, per thread, is reported with the top frames.

    python benchmarks/parameter_service.py                      # both models, ~6 min
    python benchmarks/parameter_service.py --models mlp --learners 1 4 --window-s 3

Writes ``benchmarks/results/parameter_service.{json,md}`` (``--out``): every setting, each
window's figures and latencies, the profile. ``--label`` names the code measured (before /
after a change) so that two runs can be set side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
PIPELINES = {"mlp": ("MLP 64x64 (CartPole PPO)", HERE.parent / "pipelines" / "ppo_cartpole.yaml"),
             "cnn": ("Nature CNN (Atari PPO)", HERE.parent / "pipelines" / "ppo_pong.yaml")}
KINDS = ("push", "learner_pull", "sampler_pull")


def model_size(model: str) -> int:
    from dask_rl.api import resolve
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model

    cfg = resolve(PIPELINES[model][1], [])
    return int(get_flat(make_model(*env_spaces(cfg.env), cfg.model, seed=0)).size)


# ---- the callers (threads on workers B and C) ------------------------------------------------
def learner_loop(actor, learner_id: str, seq0: int, size: int, work_s: float, start_at: float,
                 stop_at: float, local: bool) -> list[tuple]:
    """``(kind, t_start, t_end, carried_params)`` of every call until ``stop_at``; ``local``:
    the Adam moments stay with the learner (neither pulled nor pushed)."""
    rng = np.random.default_rng(seq0)
    delta = (1e-7 * rng.standard_normal(size)).astype(np.float32)
    opt = None if local else {"m": np.zeros(size, np.float32),
                              "v": np.zeros(size, np.float32), "t": 1}
    calls, seq = [], seq0
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < stop_at:
        t0 = time.time()
        snapshot = actor.call("pull_learner", learner_id, opt_state=not local)
        t1 = time.time()
        calls.append(("learner_pull", t0, t1, snapshot is not None))
        if snapshot is None:
            continue
        time.sleep(work_s)
        t2 = time.time()
        actor.call("push", delta, snapshot.version, learner_id, opt_state=opt, seq=seq)
        calls.append(("push", t2, time.time(), False))
        seq += 1
    return calls


def sampler_loop(actor, sample_s: float, start_at: float, stop_at: float) -> list[tuple]:
    calls, held = [], -1
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < stop_at:
        t0 = time.time()
        snapshot = actor.call("pull", newer_than=held)
        calls.append(("sampler_pull", t0, time.time(), snapshot is not None))
        if snapshot is not None:
            held = snapshot.version
        time.sleep(sample_s)
    return calls


def cpu_seconds() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


# ---- the profile (a task on the actor's worker) ----------------------------------------------
CAUSES = (  # (cause, predicate on (filename, function)); the innermost frame that matches wins
    ("actor methods", lambda f, fn: "dask_rl/" in f or "/numpy/" in f),
    ("serialisation", lambda f, fn: "pickle" in f or "distributed/protocol" in f
     or fn in ("dumps", "loads")),
    ("network", lambda f, fn: "distributed/comm" in f or "tornado/iostream" in f),
    ("event loop", lambda f, fn: "tornado" in f or "asyncio" in f),
)
# a thread whose innermost Python frame is one of these is blocked in C, waiting for work
IDLE = {"select", "poll", "_poll", "wait", "get", "sleep", "_recv", "_recv_bytes", "recv",
        "recv_into", "_recv_into", "readinto", "accept", "_wait_for_tstate_lock", "_worker"}


def classify(stack: list[tuple[str, str]]) -> str:
    """The cause of one sample; ``stack`` is innermost first. Numpy's and the lock's work
    happen in C, below the innermost Python frame: a sample in the actor's ``_locked``
    wrapper itself is a wait for the actor's lock, one in an actor method is its math."""
    f0, fn0 = stack[0]
    if "parameter_actor" in f0 and fn0 == "wrapper":
        return "lock wait"
    if fn0 in IDLE:
        return "idle"
    for f, fn in stack:
        for cause, match in CAUSES:
            if match(f, fn):
                return cause
    return "other"


def sample_stacks(duration_s: float, interval_s: float) -> dict:
    """Every thread's stack of this process every ``interval_s`` for ``duration_s``."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    by_thread: dict[str, Counter] = {}
    frames_top: Counter = Counter()
    samples = 0
    stop = time.perf_counter() + duration_s
    while time.perf_counter() < stop:
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack = []
            while frame is not None and len(stack) < 40:
                stack.append((frame.f_code.co_filename, frame.f_code.co_name))
                frame = frame.f_back
            cause = classify(stack)
            name = names.get(ident) or str(ident)
            name = ("actor thread" if "Dask-Actor-Threads" in name
                    else "task thread" if "Dask-Default-Threads" in name else name)
            by_thread.setdefault(name, Counter())[cause] += 1
            if cause != "idle":
                f, fn = stack[0]
                frames_top[f"{cause}: {Path(f).name}:{fn}"] += 1
        samples += 1
        time.sleep(interval_s)
    return {"samples": samples, "interval_s": interval_s,
            "by_thread": {k: dict(v) for k, v in by_thread.items()},
            "top_frames": frames_top.most_common(15)}


# ---- one window ------------------------------------------------------------------------------
def new_actor(client, worker: str, size: int, learners: int, combine: bool, direct: bool):
    from dask_rl.config import AggregationConfig
    from dask_rl.runtime.handle import ActorHandle
    from dask_rl.runtime.parameter_actor import ParameterActor

    future = client.submit(ParameterActor, np.zeros(size, np.float32),
                           AggregationConfig(strategy="async"), learners=learners, actor=True,
                           pure=False, workers=[worker])
    actor = future.result()
    channel = actor.open_channel().result() if direct else None
    return future, ActorHandle(actor, timeout=300.0, combine=combine, channel=channel)


def combined_counts(key: str) -> dict:
    """This worker's combiner of calls to the actor ``key``: calls made (in all and per
    method) and trips sent."""
    from dask_rl.runtime import combiner

    return combiner.counts(key)


PATHS = {"uncombined": (False, False, False), "combined": (True, False, False),
         "combined-local": (True, True, False),
         "direct": (True, False, True)}  # path -> (combine, moments local, direct channel)


def window(client, workers: list[str], size: int, k: int, args: argparse.Namespace, *,
           path: str, profile: bool = False) -> dict:
    combine, local, direct = PATHS[path]
    actor_worker, callers = workers[0], workers[1:]
    future, actor = new_actor(client, actor_worker, size, k, combine, direct)
    start_at = time.time() + 1.5 + 0.03 * k
    begin, stop_at = start_at + args.warmup_s, start_at + args.warmup_s + args.window_s
    cpu0 = client.run(cpu_seconds)
    cpu0["scheduler"] = client.run_on_scheduler(cpu_seconds)
    loops = []
    for i in range(k):
        loops.append(client.submit(learner_loop, actor, f"L{i}", i * 10**7, size,
                                   args.work_ms / 1e3, start_at, stop_at, local, pure=False,
                                   workers=[callers[i % len(callers)]]))
        loops.append(client.submit(sampler_loop, actor, args.sample_ms / 1e3, start_at,
                                   stop_at, pure=False,
                                   workers=[callers[(i + 1) % len(callers)]]))
    prof = None
    if profile:
        time.sleep(max(0.0, begin - time.time()))
        prof = client.submit(sample_stacks, args.window_s, args.profile_ms / 1e3, pure=False,
                             workers=[actor_worker]).result()
    calls = [c for rows in client.gather(loops) for c in rows]
    cpu1 = client.run(cpu_seconds)
    cpu1["scheduler"] = client.run_on_scheduler(cpu_seconds)
    metrics = actor.call("metrics")
    trips = client.run(combined_counts, actor.key, workers=callers)
    client.cancel([future])
    out = {"learners": k, "samplers": k, "window_s": args.window_s, "path": path,
           "combine": combine, "moments_local": local, "direct_channel": direct,
           "combined": trips}
    for kind in KINDS:
        mine = [c for c in calls if c[0] == kind and begin <= c[2] <= stop_at]
        lat = np.array([c[2] - c[1] for c in mine]) * 1e3
        out[kind] = {"per_s": len(mine) / args.window_s,
                     "with_params": sum(1 for c in mine if c[3]),
                     "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                     "p99_ms": float(np.percentile(lat, 99)) if lat.size else None}
    whole = args.warmup_s + args.window_s + 1.5
    out["cpu_s_per_s"] = {("actor" if w == actor_worker else "scheduler" if w == "scheduler"
                           else f"caller {callers.index(w) + 1}"): (cpu1[w] - cpu0[w]) / whole
                          for w in cpu0}
    out["actor_pushes_total"] = metrics["actor/pushes"]
    if prof is not None:
        out["profile"] = prof
    return out


def profile_table(prof: dict) -> list[str]:
    lines = ["| thread | busy share of samples | causes (share of its busy samples) |",
             "|---|---|---|"]
    for thread, causes in sorted(prof["by_thread"].items()):
        total = sum(causes.values())
        busy = total - causes.get("idle", 0)
        if not busy:
            continue
        parts = ", ".join(f"{c} {n / busy:.0%}" for c, n in
                          sorted(causes.items(), key=lambda x: -x[1]) if c != "idle")
        lines.append(f"| {thread} | {busy / total:.0%} | {parts} |")
    lines += ["", "Top frames (innermost, busy samples): " + "; ".join(
        f"{name} ({n})" for name, n in prof["top_frames"][:10])]
    return lines


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def per_trip(w: dict) -> str:
    """Mean calls per trip over the callers' combiners ("—": not combined)."""
    calls = sum(per["calls"] for per in w["combined"].values())
    trips = sum(per["trips"] for per in w["combined"].values())
    return f"{calls / trips:.1f}" if trips else "—"


def markdown(result: dict) -> str:
    lines = [f"Parameter service, code: {result['label']} ({result['settings']['work_ms']} ms "
             f"learner work, {result['settings']['sample_ms']} ms between a sampler's pulls, "
             f"{result['settings']['window_s']} s windows).", ""]
    for model, rows in result["models"].items():
        lines += [f"### {rows['name']} ({rows['params']:,} float32 parameters)", "",
                  "| learners + samplers | path | pushes/s | learner pulls/s | sampler "
                  "pulls/s (with params) | push p50 / p99 ms | learner pull p50 / p99 ms | "
                  "sampler pull p50 / p99 ms | calls per trip | CPU s/s: actor, callers, "
                  "scheduler | calls per actor CPU second (x uncombined) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        capacity = {}
        for w in rows["windows"]:
            calls = w["push"]["per_s"] + w["learner_pull"]["per_s"] + w["sampler_pull"]["per_s"]
            cap = calls / max(w["cpu_s_per_s"]["actor"], 1e-9)   # the service's capacity
            if w["path"] == "uncombined":
                capacity[w["learners"]] = cap
            base = capacity.get(w["learners"])
            times = f" (x{cap / base:.2f})" if base else ""
            def lat(kind):
                return f"{_ms(w[kind]['p50_ms'])} / {_ms(w[kind]['p99_ms'])}"
            cpu = w["cpu_s_per_s"]
            callers = sum(v for k, v in cpu.items() if k.startswith("caller"))
            lines.append(
                f"| {w['learners']} + {w['samplers']} | {w['path']} | "
                f"{w['push']['per_s']:.0f} | "
                f"{w['learner_pull']['per_s']:.0f} | {w['sampler_pull']['per_s']:.0f} "
                f"({w['sampler_pull']['with_params'] / w['window_s']:.0f}) | {lat('push')} | "
                f"{lat('learner_pull')} | {lat('sampler_pull')} | {per_trip(w)} | "
                f"{cpu['actor']:.2f}, "
                f"{callers:.2f}, {cpu['scheduler']:.2f} | {cap:,.0f}{times} |")
        for mode, w in rows.get("profile", {}).items():
            lines += ["", f"Where the actor's worker spends its time, path {mode} "
                      f"({rows['profile_k']} learners + {rows['profile_k']} samplers, stacks "
                      f"sampled every {result['settings']['profile_ms']} ms):", ""]
            lines += profile_table(w["profile"])
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(PIPELINES), default=list(PIPELINES))
    ap.add_argument("--learners", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--work-ms", type=float, default=1.0, help="a learner's sleep per task")
    ap.add_argument("--sample-ms", type=float, default=5.0, help="a sampler's sleep per pull")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=8.0)
    ap.add_argument("--profile-k", type=int, default=16)
    ap.add_argument("--profile-ms", type=float, default=5.0)
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
                    help="uncombined: one actor call per call with the moments (the path "
                         "before); combined: call combining; combined-local: and the moments "
                         "stay with the learners; direct: call combining, trips over the "
                         "actor's direct channel (cluster.actor_transport: direct)")
    ap.add_argument("--label", default="current")
    ap.add_argument("--out", default=str(HERE / "results" / "parameter_service"))
    args = ap.parse_args()

    import dask
    from distributed import Client, LocalCluster

    threads = 2 * max(max(args.learners), args.profile_k)
    result = {"benchmark": "parameter_service", "label": args.label, "settings": vars(args),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "cluster": {"kind": "LocalCluster", "n_workers": 3, "threads_per_worker": threads,
                          "processes": True, "profile": False},
              "models": {}}
    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            LocalCluster(n_workers=3, threads_per_worker=threads, processes=True,
                         dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        for model in args.models:
            name, _ = PIPELINES[model]
            size = model_size(model)
            rows = {"name": name, "params": size, "windows": [], "profile_k": args.profile_k}
            for k in args.learners:
                for mode in args.paths:  # side by side, in the order given
                    w = window(client, workers, size, k, args, path=mode)
                    rows["windows"].append(w)
                    print(f"{model} K={k:3d} {mode:14s}: pushes/s "
                          f"{w['push']['per_s']:7.1f}  learner pulls/s "
                          f"{w['learner_pull']['per_s']:7.1f}  sampler pulls/s "
                          f"{w['sampler_pull']['per_s']:7.1f}  push p50/p99 "
                          f"{_ms(w['push']['p50_ms'])}/{_ms(w['push']['p99_ms'])} ms  actor "
                          f"CPU {w['cpu_s_per_s']['actor']:.2f} s/s", flush=True)
            rows["profile"] = {mode: window(client, workers, size, args.profile_k, args,
                                            path=mode, profile=True)
                               for mode in args.paths}
            result["models"][model] = rows
    text = markdown(result)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    from stats import record_commit
    record_commit(out.with_suffix(".json"))
    out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
