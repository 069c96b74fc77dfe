"""Rollout throughput: env steps/s of rollout tasks on N workers vs plain processes.

Every side steps the same ``Collector`` (vector env + batched policy inference) and **the
policy really moves**: every ``--push-every`` finished rollouts a new parameter vector (the old
one plus a random delta of the model's size) replaces it, so each rollout after a change loads
new weights. The Dask side keeps two rollout tasks per worker in flight on a LocalCluster of N
single-threaded worker processes; each task pulls the policy from the parameter actor as in
training (a pull returns nothing when the version is unchanged), and the driver pushes the
deltas to the actor, which applies them as it applies a learner's (the ``async`` strategy).
Learner compute itself is left out on every side: the question is the cost of the sampling
path, and a learner on the same cores would only take CPU from it. The plain sides run
``collect`` in a loop and load the new weights in place.

The Dask side's cluster is the product's: ``dask_rl.runtime.cluster.connect`` on the
pipeline's ``cluster:`` section (its settings, its workers forked from the warm process),
``cluster.n_workers`` N, the dashboard off.

Two baselines: N x the rate of one plain process (the ideal, if N processes did not share
anything), and N plain processes run at once (what this machine gives N independent samplers:
shared caches, memory bandwidth; and on 2 cores nothing left for a scheduler). The target is
``dask / concurrent >= 0.9`` at N = 2. Each repeat measures the three sides back to back, in
an order that rotates from repeat to repeat, and gives one ratio per baseline; the ratios'
means are reported with Student-t 95% intervals over the repeats (the machine's speed drifts
between repeats, much less within one).

    python benchmarks/sampling_throughput.py --seconds 8 --repeats 5

Writes ``benchmarks/results/sampling_throughput.json`` (with the commit it ran on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# CartPole steps cost ~20 us, so a task's fixed cost (policy pull, scheduling, trajectory
# bookkeeping: ~10 ms) is visible at 4k samples per task; the x32 row halves its share.
ENVS = {
    "CartPole-v1": {"env": {"id": "CartPole-v1", "num_envs": 16}, "rollout": {"steps": 256}},
    "CartPole-v1 x32": {"env": {"id": "CartPole-v1", "num_envs": 32}, "rollout": {"steps": 256}},
    "HalfCheetah-v5": {"env": {"id": "HalfCheetah-v5", "num_envs": 8}, "rollout": {"steps": 256}},
}


DELTA_SCALE = 1e-3   # small enough that the policy stays a policy, large enough to change it


def plain_rate(cfg, seconds: float, push_every: int = 2, seed: int = 0) -> float:
    import numpy as np
    import torch

    from dask_rl.data import PolicySnapshot
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.collector import Collector

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    rw = Collector(cfg, seed=seed)
    params = get_flat(make_model(*env_spaces(cfg.env), cfg.model, seed=0))
    rw.load(PolicySnapshot(0, params))
    rw.collect(cfg.rollout.steps)  # warm-up
    steps, rollouts, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += rw.collect(cfg.rollout.steps).env_steps
        rollouts += 1
        if rollouts % push_every == 0:  # the policy moves: new weights, loaded in place
            params = params + DELTA_SCALE * rng.standard_normal(params.size).astype(params.dtype)
            rw.load(PolicySnapshot(rollouts, params))
    return steps / (time.perf_counter() - t0)


def concurrent_plain_rate(cfg, processes: int, seconds: float, push_every: int = 2) -> float:
    """Summed rate of ``processes`` plain processes stepping at once: what the hardware gives
    N independent samplers here (shared caches, memory bandwidth), with no framework at all."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        return sum(pool.map(plain_rate, [cfg] * processes, [seconds] * processes,
                            [push_every] * processes, range(processes)))


def dask_rate(cfg, workers: int, seconds: float, push_every: int = 2) -> tuple[float, int]:
    """Steps/s of rollout tasks while the driver moves the policy; and how many versions the
    actor went through."""
    import dataclasses

    import numpy as np
    from distributed import wait

    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.runtime.cluster import connect, place_slots
    from dask_rl.runtime.handle import ActorHandle
    from dask_rl.runtime.parameter_actor import ParameterActor
    from dask_rl.runtime.plugins import RunState
    from dask_rl.runtime.tasks import rollout_task

    cluster = dataclasses.replace(cfg.cluster, n_workers=workers, threads_per_worker=1,
                                  dashboard=False)
    with connect(cluster) as c:
        run = f"bench-{uuid.uuid4().hex[:6]}"
        c.register_plugin(RunState(run, cfg), name=run)
        params = get_flat(make_model(*env_spaces(cfg.env), cfg.model, seed=0))
        actor = ActorHandle(c.submit(ParameterActor, params, cfg.aggregation, actor=True).result())
        slots = 2 * workers
        placement = place_slots(c, slots)

        def submit(slot):
            return c.submit(rollout_task, run, slot, actor, pure=False,
                            workers=[placement[slot]], allow_other_workers=True)

        wait([submit(s) for s in range(slots)])  # warm-up: every slot's envs exist
        rng = np.random.default_rng(0)
        inflight = {submit(s): s for s in range(slots)}
        steps, rollouts, version, t0 = 0, 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            done, _ = wait(list(inflight), return_when="FIRST_COMPLETED")
            for fut in done:
                slot = inflight.pop(fut)
                steps += cfg.batch_size
                rollouts += 1
                inflight[submit(slot)] = slot
                if rollouts % push_every == 0:  # the policy moves, as a learner's push moves it
                    delta = DELTA_SCALE * rng.standard_normal(params.size).astype(params.dtype)
                    version = actor.call("push", delta, version, "bench").version
        elapsed = time.perf_counter() - t0
        c.cancel(list(inflight))
        return steps / elapsed, version


def main() -> int:
    from stats import mean_ci

    from dask_rl.config import from_dict, public_dict
    from dask_rl.runtime.worker_start import warm_start

    warm_start()   # as dask-rl train does, first thing
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    ap.add_argument("--repeats", type=int, default=5,
                    help="repeats of the three sides, back to back in rotating order")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--envs", nargs="+", default=list(ENVS))
    ap.add_argument("--push-every", type=int, default=2,
                    help="finished rollouts between policy changes")
    ap.add_argument("--out", default=str(HERE / "results" / "sampling_throughput.json"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    rows = []
    for env_id in args.envs:
        cfg = from_dict(ENVS[env_id])
        for n in args.workers:
            sides = {
                "plain": lambda: plain_rate(cfg, args.seconds, args.push_every),
                "concurrent": lambda: concurrent_plain_rate(cfg, n, args.seconds,
                                                            args.push_every),
                "dask": lambda: dask_rate(cfg, n, args.seconds, args.push_every)}
            runs: dict[str, list] = {k: [] for k in sides}
            order = list(sides)
            for rep in range(args.repeats):
                for k in order[rep % 3:] + order[:rep % 3]:
                    runs[k].append(sides[k]())
            versions = [v for _, v in runs["dask"]]
            runs["dask"] = [r for r, _ in runs["dask"]]
            vs_conc = [d / c for d, c in zip(runs["dask"], runs["concurrent"])]
            vs_n = [d / (n * p) for d, p in zip(runs["dask"], runs["plain"])]
            m_c, lo_c, hi_c = mean_ci(vs_conc)
            m_n, lo_n, hi_n = mean_ci(vs_n)
            row = {"env_id": env_id, "workers": n, "config": public_dict(cfg),
                   "push_every": args.push_every, "seconds": args.seconds,
                   "plain_steps_per_s": statistics.median(runs["plain"]),
                   "concurrent_plain_steps_per_s": statistics.median(runs["concurrent"]),
                   "dask_steps_per_s": statistics.median(runs["dask"]),
                   "ratio_vs_concurrent": m_c, "ratio_vs_concurrent_ci95": [lo_c, hi_c],
                   "ratio_vs_n_plain": m_n, "ratio_vs_n_plain_ci95": [lo_n, hi_n],
                   "ratios_vs_concurrent": vs_conc, "ratios_vs_n_plain": vs_n,
                   "task_samples": cfg.batch_size, "plain_runs": runs["plain"],
                   "concurrent_runs": runs["concurrent"], "dask_runs": runs["dask"],
                   "policy_versions": versions}
            rows.append(row)
            print(f"{env_id:17s} N={n}: plain {row['plain_steps_per_s']:8.0f}/s, {n} at once "
                  f"{row['concurrent_plain_steps_per_s']:8.0f}/s, dask "
                  f"{row['dask_steps_per_s']:8.0f}/s: ratio vs at once {m_c:.3f} "
                  f"[{lo_c:.3f}, {hi_c:.3f}] (target >= 0.9), vs N x plain {m_n:.3f}",
                  flush=True)
    print("\n| env | workers | plain steps/s | N plain at once | dask-rl steps/s | "
          "dask-rl / N at once [95% CI] | dask-rl / N x plain [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c, n_ = r["ratio_vs_concurrent_ci95"], r["ratio_vs_n_plain_ci95"]
        print(f"| {r['env_id']} | {r['workers']} | {r['plain_steps_per_s']:,.0f} | "
              f"{r['concurrent_plain_steps_per_s']:,.0f} | {r['dask_steps_per_s']:,.0f} | "
              f"{r['ratio_vs_concurrent']:.2f} [{c[0]:.2f}, {c[1]:.2f}] | "
              f"{r['ratio_vs_n_plain']:.2f} [{n_[0]:.2f}, {n_[1]:.2f}] |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "benchmark": "sampling_throughput", "commit": commit,
        "command": " ".join(["python", "benchmarks/sampling_throughput.py", *sys.argv[1:]]),
        "repeats": args.repeats, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
