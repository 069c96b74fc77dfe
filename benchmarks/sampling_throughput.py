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

Two baselines: N x the rate of one plain process (the ideal, if N processes did not share
anything), and N plain processes run at once (what this machine gives N independent samplers:
shared caches, memory bandwidth; and on 2 cores nothing left for a scheduler). The target is
``dask / concurrent >= 0.9`` at N = 2. Rounds alternate between the sides; medians are
reported with every round's figure.

    python benchmarks/sampling_throughput.py --seconds 10 --rounds 3

Writes ``benchmarks/results/sampling_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent

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
    import dask
    import numpy as np
    from distributed import Client, LocalCluster, wait

    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.runtime.cluster import place_slots
    from dask_rl.runtime.handle import ActorHandle
    from dask_rl.runtime.parameter_actor import ParameterActor
    from dask_rl.runtime.plugins import RunState
    from dask_rl.runtime.tasks import rollout_task

    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None,
                         silence_logs=50) as cluster, \
            Client(cluster, direct_to_workers=True) as c:
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
    from dask_rl.config import from_dict

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating plain/dask measurements; medians are reported")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--envs", nargs="+", default=list(ENVS))
    ap.add_argument("--push-every", type=int, default=2,
                    help="finished rollouts between policy changes")
    ap.add_argument("--out", default=str(HERE / "results" / "sampling_throughput.json"))
    args = ap.parse_args()
    rows = []
    for env_id in args.envs:
        cfg = from_dict(ENVS[env_id])
        for n in args.workers:
            # the sides measured back to back, alternating, so noise hits them alike
            plains, concurrents, dasks, versions = [], [], [], []
            for _ in range(args.rounds):
                plains.append(plain_rate(cfg, args.seconds, args.push_every))
                concurrents.append(concurrent_plain_rate(cfg, n, args.seconds, args.push_every))
                rate, moved = dask_rate(cfg, n, args.seconds, args.push_every)
                dasks.append(rate)
                versions.append(moved)
            plain, conc = statistics.median(plains), statistics.median(concurrents)
            distributed = statistics.median(dasks)
            row = {"env_id": env_id, "workers": n, "config": ENVS[env_id],
                   "push_every": args.push_every, "seconds": args.seconds,
                   "plain_steps_per_s": plain, "concurrent_plain_steps_per_s": conc,
                   "dask_steps_per_s": distributed, "ratio_vs_n_plain": distributed / (n * plain),
                   "ratio_vs_concurrent": distributed / conc,
                   "task_samples": cfg.batch_size, "plain_runs": plains,
                   "concurrent_runs": concurrents, "dask_runs": dasks,
                   "policy_versions": versions}
            rows.append(row)
            print(f"{env_id:17s} N={n}: plain {plain:8.0f}/s, {n} at once {conc:8.0f}/s, dask "
                  f"{distributed:8.0f}/s ({versions[-1]} versions): ratio vs concurrent "
                  f"{row['ratio_vs_concurrent']:.2f} (target >= 0.9), vs N x plain "
                  f"{row['ratio_vs_n_plain']:.2f}", flush=True)
    print("\n| env | workers | plain steps/s | N plain at once | dask-rl steps/s | "
          "ratio vs at once | ratio vs N x plain |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env_id']} | {r['workers']} | {r['plain_steps_per_s']:.0f} | "
              f"{r['concurrent_plain_steps_per_s']:.0f} | {r['dask_steps_per_s']:.0f} | "
              f"{r['ratio_vs_concurrent']:.2f} | {r['ratio_vs_n_plain']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
