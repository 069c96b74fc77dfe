"""Time to solve CartPole-v1: dask-rl on 2 workers vs the same PPO in one plain process.

Both sides run the same ``dask_rl`` building blocks (``Collector``, ``Learner``, the
``ParameterActor`` class and its strategy) with the same hyperparameters and stop rule: a
greedy evaluation of 10 episodes reaching 475, tried whenever the last 20 training episodes
average 475 or every 50 updates. The single process alternates rollout and learning (one
learner, ``sync``); dask-rl runs ``pipelines/ppo_cartpole.yaml`` (asynchronous learners on an
embedded 2-worker LocalCluster). Seeds alternate between the two sides so machine noise hits
both alike.

    python benchmarks/cartpole_time_to_solve.py --seeds 5

Prints a table and the ratio of median wall times (dask-rl / single process); writes
``benchmarks/results/cartpole_time_to_solve.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PIPELINE = HERE.parent / "pipelines" / "ppo_cartpole.yaml"


def single_process(seed: int, overrides: list[str]) -> dict:
    """PPO in this process: rollout, learn, apply, repeat; the driver's stop rule."""
    import torch

    from dask_rl.api import resolve
    from dask_rl.envs import env_spaces, reward_threshold
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.collector import Collector
    from dask_rl.roles.evaluation import evaluate
    from dask_rl.roles.learner import Learner
    from dask_rl.runtime.parameter_actor import ParameterActor

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    cfg = resolve(PIPELINE, [f"seed={seed}", "aggregation.strategy=sync", *overrides])
    spaces = env_spaces(cfg.env)
    params = get_flat(make_model(*spaces, cfg.model, seed=cfg.seed))
    actor = ParameterActor(params, cfg.aggregation)
    rollout = Collector(cfg, seed=seed)
    learner = Learner(cfg, *spaces)
    target = reward_threshold(cfg.env.id)
    returns: deque[float] = deque(maxlen=20)
    steps, last_eval, evals, solved, final = 0, -1, 0, False, None
    while steps < cfg.stop.env_steps:
        snap = actor.pull()
        rollout.load(snap)
        traj = rollout.collect(cfg.rollout.steps)
        steps += traj.env_steps
        returns.extend(traj.episode_returns.tolist())
        lr = cfg.learner.lr * max(1.0 - steps / cfg.stop.env_steps, 0.01)
        res = learner.update(actor.pull(learner_id="L", learner_state=True), traj, lr=lr,
                             seed=snap.version)
        actor.push(res.delta, res.version, "L", opt_state=res.opt_state)
        version = actor.current.version
        at_target = len(returns) >= 5 and np.mean(returns) >= target
        if version != last_eval and (at_target or version - max(last_eval, 0) >= 50):
            last_eval = version
            evals += 1
            final = evaluate(cfg, actor.pull(), episodes=10, seed=10_000 + evals)
            if final.mean_return >= target:
                solved = True
                break
    return {"side": "single", "seed": seed, "wall_s": time.perf_counter() - t0,
            "env_steps": steps, "solved": solved, "final_return": final and final.mean_return}


def dask_rl_run(seed: int, overrides: list[str], workers: int) -> dict:
    from distributed import Client, LocalCluster

    import dask_rl

    t0 = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        t_cluster = time.perf_counter() - t0
        run_dir = HERE / "results" / f"ttsolve-dask-{seed}"
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
        res = dask_rl.train(PIPELINE, client=client, run_dir=run_dir,
                            overrides=[f"seed={seed}", "checkpoint.every_s=0", *overrides])
    s = res.summary
    return {"side": "dask-rl", "seed": seed, "wall_s": s["wall_s"], "cluster_start_s": t_cluster,
            "env_steps": s["env_steps"], "solved": s["solved"], "final_return": s["final_return"],
            "staleness_mean": s["staleness_mean"], "steps_per_s": s["steps_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="pipeline override for both sides")
    ap.add_argument("--out", default=str(HERE / "results" / "cartpole_time_to_solve.json"))
    args = ap.parse_args()
    rows = []
    for seed in range(1, args.seeds + 1):
        for side in (("single", "dask") if seed % 2 else ("dask", "single")):
            r = (single_process(seed, args.overrides) if side == "single"
                 else dask_rl_run(seed, args.overrides, args.workers))
            rows.append(r)
            print(f"{r['side']:8s} seed {seed}: {r['wall_s']:6.1f} s, {r['env_steps']:7d} steps, "
                  f"solved={r['solved']}", flush=True)
    out: dict = {"rows": rows}
    for side in ("single", "dask-rl"):
        mine = [r for r in rows if r["side"] == side]
        out[side] = {"median_wall_s": statistics.median(r["wall_s"] for r in mine),
                     "median_env_steps": statistics.median(r["env_steps"] for r in mine),
                     "solved": sum(r["solved"] for r in mine), "runs": len(mine),
                     "median_steps_per_s": statistics.median(r["env_steps"] / r["wall_s"]
                                                             for r in mine)}
    out["ratio_wall"] = out["dask-rl"]["median_wall_s"] / out["single"]["median_wall_s"]
    out["ratio_env_steps"] = out["dask-rl"]["median_env_steps"] / out["single"]["median_env_steps"]
    out["ratio_steps_per_s"] = (out["dask-rl"]["median_steps_per_s"]
                                / out["single"]["median_steps_per_s"])
    print()
    print("| side | median wall s | median env steps | median steps/s | solved |")
    print("|---|---|---|---|---|")
    for side in ("single", "dask-rl"):
        o = out[side]
        print(f"| {side} | {o['median_wall_s']:.1f} | {o['median_env_steps']:.0f} | "
              f"{o['median_steps_per_s']:.0f} | {o['solved']}/{o['runs']} |")
    print(f"\nratio dask-rl / single: wall {out['ratio_wall']:.2f}x, env steps "
          f"{out['ratio_env_steps']:.2f}x, throughput {out['ratio_steps_per_s']:.2f}x "
          f"(target: wall <= 1.0x)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
