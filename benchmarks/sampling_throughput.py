"""Rollout throughput: env steps/s of rollout tasks on N workers vs N x one plain process.

Both sides step the same ``Collector`` (vector env + batched policy inference). The plain
side runs ``collect`` in a loop in this process; the Dask side keeps two rollout tasks per
worker in flight on a LocalCluster of N single-threaded worker processes, each task pulling the
policy from the parameter actor as in training, and throws the trajectories away. The ratio
``dask / (N x plain)`` is the share of the raw sampling rate the engine delivers (target >= 0.9).

    python benchmarks/sampling_throughput.py --seconds 20

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


def plain_rate(cfg, seconds: float) -> float:
    import torch

    from dask_rl.data import PolicySnapshot
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.collector import Collector

    torch.set_num_threads(1)
    rw = Collector(cfg, seed=0)
    rw.load(PolicySnapshot(0, get_flat(make_model(*env_spaces(cfg.env), cfg.model, seed=0))))
    rw.collect(cfg.rollout.steps)  # warm-up
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += rw.collect(cfg.rollout.steps).env_steps
    return steps / (time.perf_counter() - t0)


def concurrent_plain_rate(cfg, processes: int, seconds: float) -> float:
    """Summed rate of ``processes`` plain processes stepping at once: what the hardware gives
    N independent samplers here (shared caches, memory bandwidth), with no framework at all."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        return sum(pool.map(plain_rate, [cfg] * processes, [seconds] * processes))


def dask_rate(cfg, workers: int, seconds: float) -> float:
    import dask
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
        inflight = {submit(s): s for s in range(slots)}
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            done, _ = wait(list(inflight), return_when="FIRST_COMPLETED")
            for fut in done:
                slot = inflight.pop(fut)
                steps += cfg.batch_size
                inflight[submit(slot)] = slot
        elapsed = time.perf_counter() - t0
        c.cancel(list(inflight))
        return steps / elapsed


def main() -> int:
    from dask_rl.config import from_dict

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating plain/dask measurements; medians are reported")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--envs", nargs="+", default=list(ENVS))
    ap.add_argument("--out", default=str(HERE / "results" / "sampling_throughput.json"))
    args = ap.parse_args()
    rows = []
    for env_id in args.envs:
        cfg = from_dict(ENVS[env_id])
        for n in args.workers:
            # plain and Dask measured back to back, alternating, so noise hits both alike
            plains, dasks = [], []
            for _ in range(args.rounds):
                plains.append(plain_rate(cfg, args.seconds))
                dasks.append(dask_rate(cfg, n, args.seconds))
            plain, distributed = statistics.median(plains), statistics.median(dasks)
            row = {"env_id": env_id, "workers": n, "plain_steps_per_s": plain,
                   "dask_steps_per_s": distributed, "ratio": distributed / (n * plain),
                   "task_samples": cfg.batch_size, "plain_runs": plains, "dask_runs": dasks}
            rows.append(row)
            print(f"{env_id:17s} N={n}: plain {plain:8.0f}/s, dask {distributed:8.0f}/s, "
                  f"ratio {row['ratio']:.2f} (target >= 0.9)", flush=True)
    print("\n| env | workers | plain steps/s | dask-rl steps/s | ratio vs N x plain |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env_id']} | {r['workers']} | {r['plain_steps_per_s']:.0f} | "
              f"{r['dask_steps_per_s']:.0f} | {r['ratio']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
