"""Time to solve CartPole-v1: dask-rl on 2 workers vs the same PPO in one plain process.

Both sides train ``pipelines/ppo_cartpole.yaml`` (same hyperparameters, same budget, the same
``dask_rl`` building blocks: ``Collector``, ``Learner``, ``ParameterActor``) for a fixed
budget of env steps, **without stopping on a target**. Each takes a snapshot of its policy
every ``--grid`` learned env steps (a copy of the parameters, which does not pause training;
both sides pay it) and notes the wall time since its command started — a fresh Python process
on both sides, so the wall includes interpreter start-up, imports and, for dask-rl, the
``LocalCluster``'s start-up.

After training, the same judge runs for both sides, in this process: the snapshots are
screened in order (greedy, 10 episodes); the first to reach 475 is confirmed on 100 fresh
episodes (Gymnasium's definition of solving CartPole-v1), and the first confirmed snapshot is
the time to solve — its env steps and its wall time. A snapshot whose confirmation fails
leaves the search going on down the grid. A run with no confirmed snapshot within the budget
is censored: reported as unsolved, and its time counted as infinite in the medians.

The single process alternates rollout and learning (one learner, ``sync``: a plain PPO loop);
dask-rl runs its asynchronous learners on an embedded 2-worker ``LocalCluster``. Seeds
alternate which side goes first, so that machine noise hits both alike.

    python benchmarks/cartpole_time_to_solve.py --seeds 10

Writes ``benchmarks/results/cartpole_time_to_solve.json``: every run's effective config and
grid, the per-seed times, medians and means with bootstrap 95% CIs of the dask-rl / single
ratios (time to solve, and wall time at equal env steps: throughput).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
PIPELINE = HERE.parent / "pipelines" / "ppo_cartpole.yaml"
TARGET = 475.0
SCREEN_EPISODES, CONFIRM_EPISODES = 10, 100


# ---- the two sides: each runs in a fresh process (``--side``) ----------------------------------
def _config(seed: int, budget: int, side: str, overrides: list[str]):
    from dask_rl.api import resolve

    extra = ["aggregation.strategy=sync", "learner.max_learners=1"] if side == "single" else []
    return resolve(PIPELINE, [f"seed={seed}", f"stop.env_steps={budget}",
                              "stop.solve_on_target=false", "stop.eval_every_updates=0",
                              "checkpoint.every_s=0", *extra, *overrides])


def single_side(seed: int, budget: int, grid: int, overrides: list[str], t_spawn: float,
                out: Path) -> None:
    """PPO in this process: rollout, learn, apply, repeat; a snapshot every ``grid`` steps."""
    import torch

    from dask_rl.control.schedule import learning_rate
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.collector import Collector
    from dask_rl.roles.learner import Learner
    from dask_rl.runtime.parameter_actor import ParameterActor

    torch.set_num_threads(1)
    cfg = _config(seed, budget, "single", overrides)
    spaces = env_spaces(cfg.env)
    actor = ParameterActor(get_flat(make_model(*spaces, cfg.model, seed=cfg.seed)),
                           cfg.aggregation)
    rollout = Collector(cfg, seed=seed)
    learner = Learner(cfg, *spaces)
    snaps, steps = [], 0
    first_rollout_s = time.time() - t_spawn
    while steps < budget:
        snap = actor.pull()
        rollout.load(snap)
        traj = rollout.collect(cfg.rollout.steps)
        steps += traj.env_steps
        lr = learning_rate(cfg.learner.lr, anneal=cfg.learner.anneal_lr, env_steps=steps,
                           total_env_steps=budget)
        res = learner.update(actor.pull(learner_id="L", learner_state=True), traj, lr=lr,
                             seed=snap.version)
        actor.push(res.delta, res.version, "L", opt_state=res.opt_state)
        if steps % grid == 0:
            snaps.append((steps, time.time() - t_spawn, actor.pull()))
    _save(out, cfg, snaps, first_rollout_s=first_rollout_s)


def dask_side(seed: int, budget: int, grid: int, overrides: list[str], t_spawn: float,
              out: Path, workers: int) -> None:
    """``pipelines/ppo_cartpole.yaml`` on its embedded LocalCluster, started as ``dask-rl
    train`` starts it (the warm worker process first, then the pipeline's ``cluster:``
    section); the driver pulls a snapshot from the parameter actor each time the learned
    env steps cross the grid."""
    from dask_rl.runtime.worker_start import warm_start

    warm_start()
    from dask_rl.runtime.cluster import connect
    from dask_rl.runtime.driver import Driver

    snaps: list = []
    marks: dict = {}

    class GridDriver(Driver):
        def _launch(self):   # the first rollout: the first task that collects
            super()._launch()
            if len(self.inflight):
                marks.setdefault("first_rollout_s", time.time() - t_spawn)

    def progress(p):
        before = marks.get("learned", 0)
        marks["learned"] = p.env_steps
        if p.env_steps // grid > before // grid:
            snaps.append((p.env_steps // grid * grid, time.time() - t_spawn,
                          driver[0].actor_call("pull")))

    cfg = _config(seed, budget, "dask", overrides)
    driver: list = []
    with connect(cfg.cluster, n_workers=workers) as client, \
            tempfile.TemporaryDirectory() as run_dir:
        marks["cluster_up_s"] = time.time() - t_spawn
        driver.append(GridDriver(client, cfg, run_dir, progress=progress))
        summary = driver[0].run()
    _save(out, cfg, snaps, staleness_mean=summary.staleness_mean,
          cluster_up_s=marks["cluster_up_s"], first_rollout_s=marks["first_rollout_s"])


def _save(out: Path, cfg, snaps: list, **extra) -> None:
    from dask_rl.config import public_dict

    np.savez(out, steps=np.array([s for s, _, _ in snaps]),
             wall=np.array([w for _, w, _ in snaps]),
             versions=np.array([p.version for _, _, p in snaps]),
             params=np.stack([p.params for _, _, p in snaps]))
    out.with_suffix(".json").write_text(json.dumps({"config": public_dict(cfg), **extra}))


# ---- the judge -----------------------------------------------------------------------------
def judge(npz: Path) -> dict:
    """Screen the snapshots in order, confirm the first that passes; the time to solve."""
    from dask_rl.config import from_dict
    from dask_rl.data import PolicySnapshot
    from dask_rl.roles.evaluation import evaluate

    meta = json.loads(npz.with_suffix(".json").read_text())
    cfg = from_dict(meta["config"])
    d = np.load(npz)
    tried = []
    for k, (steps, wall, version) in enumerate(zip(d["steps"], d["wall"], d["versions"])):
        snap = PolicySnapshot(int(version), d["params"][k], None)
        screen = evaluate(cfg, snap, episodes=SCREEN_EPISODES, seed=5_000_000 + 100 * k)
        if screen.mean_return < TARGET:
            continue
        confirm = evaluate(cfg, snap, episodes=CONFIRM_EPISODES, seed=6_000_000 + 1000 * k)
        tried.append({"env_steps": int(steps), "screen": screen.mean_return,
                      "confirm": confirm.mean_return})
        if confirm.mean_return >= TARGET:
            return {"solved": True, "env_steps": int(steps), "wall_s": float(wall),
                    "confirmations": tried, "grid_wall_s": d["wall"].tolist(),
                    "grid_steps": d["steps"].tolist(), **meta}
    return {"solved": False, "env_steps": math.inf, "wall_s": math.inf, "confirmations": tried,
            "grid_wall_s": d["wall"].tolist(), "grid_steps": d["steps"].tolist(), **meta}


def run_side(side: str, seed: int, args: argparse.Namespace, work: Path) -> dict:
    out = work / f"{side}-{seed}.npz"
    cmd = [sys.executable, __file__, "--side", side, "--seed", str(seed),
           "--budget", str(args.budget), "--grid", str(args.grid),
           "--workers", str(args.workers), "--spawn", repr(time.time()), "--npz", str(out)]
    for o in args.overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True)
    row = {"side": side, "seed": seed, **judge(out)}
    return row


def _finite(xs):
    return [x for x in xs if math.isfinite(x)]


def summarise(rows: list[dict], args: argparse.Namespace) -> dict:
    from stats import bootstrap_ratio_ci

    sides = {s: [r for r in rows if r["side"] == s] for s in ("single", "dask")}
    out: dict = {"settings": {"seeds": args.seeds, "first_seed": args.first_seed,
                              "budget": args.budget, "grid": args.grid,
                              "workers": args.workers, "target": TARGET,
                              "screen_episodes": SCREEN_EPISODES,
                              "confirm_episodes": CONFIRM_EPISODES,
                              "overrides": args.overrides},
                 "rows": rows}
    for s, mine in sides.items():
        walls = [r["wall_s"] for r in mine]
        steps = [r["env_steps"] for r in mine]
        out[s] = {"runs": len(mine), "solved": sum(r["solved"] for r in mine),
                  "median_wall_s": float(np.median(walls)),
                  "mean_wall_s_solved": float(np.mean(_finite(walls))) if _finite(walls)
                  else None,
                  "median_env_steps": float(np.median(steps)),
                  "mean_env_steps_solved": float(np.mean(_finite(steps))) if _finite(steps)
                  else None}
    d, s1 = sides["dask"], sides["single"]
    for name, key, stat in (("time_to_solve_median", "wall_s", np.median),
                            ("steps_to_solve_median", "env_steps", np.median)):
        ratio, lo, hi = bootstrap_ratio_ci([r[key] for r in d], [r[key] for r in s1], stat)
        out[f"ratio_{name}"] = {"ratio": ratio, "ci95": [lo, hi]}
    # start-up excluded: wall from each run's first rollout (its imports, cluster, set-up out)
    after = {side: [r["wall_s"] - r["first_rollout_s"] for r in mine]
             for side, mine in sides.items()}
    ratio, lo, hi = bootstrap_ratio_ci(after["dask"], after["single"], np.median)
    out["ratio_time_to_solve_after_first_rollout_median"] = {"ratio": ratio, "ci95": [lo, hi]}
    for side, mine in sides.items():
        out[side]["median_first_rollout_s"] = float(np.median([r["first_rollout_s"]
                                                               for r in mine]))
    both_solved = all(math.isfinite(r["wall_s"]) for r in d + s1)
    if both_solved:
        ratio, lo, hi = bootstrap_ratio_ci([r["wall_s"] for r in d], [r["wall_s"] for r in s1],
                                           np.mean)
        out["ratio_time_to_solve_mean"] = {"ratio": ratio, "ci95": [lo, hi]}
    # throughput: wall time to the same env steps (the last grid point every run reached)
    reach = min(min(r["grid_steps"][-1] for r in d), min(r["grid_steps"][-1] for r in s1))
    at = {s: [r["grid_wall_s"][r["grid_steps"].index(reach)] for r in mine]
          for s, mine in sides.items()}
    ratio, lo, hi = bootstrap_ratio_ci(at["dask"], at["single"], np.median)
    out["ratio_wall_at_equal_steps"] = {"env_steps": reach, "ratio": ratio, "ci95": [lo, hi],
                                        "dask_wall_s": at["dask"], "single_wall_s": at["single"]}
    return out



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=101,
                    help="seeds first-seed, first-seed+1, ... (none used to tune anything)")
    ap.add_argument("--budget", type=int, default=200_704, help="env steps per run")
    ap.add_argument("--grid", type=int, default=5_120, help="env steps between snapshots")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="pipeline override for both sides")
    ap.add_argument("--out", default=str(HERE / "results" / "cartpole_time_to_solve.json"))
    # one side, in its own process (used by the parent)
    ap.add_argument("--side", choices=("single", "dask"))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--spawn", type=float)
    ap.add_argument("--npz")
    args = ap.parse_args()
    if args.grid % 512:
        ap.error("--grid must be a multiple of 512 (one trajectory of the main job)")
    if args.side == "single":
        single_side(args.seed, args.budget, args.grid, args.overrides, args.spawn,
                    Path(args.npz))
        return 0
    if args.side == "dask":
        dask_side(args.seed, args.budget, args.grid, args.overrides, args.spawn,
                  Path(args.npz), args.workers)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for side in (("single", "dask") if seed % 2 else ("dask", "single")):
                r = run_side(side, seed, args, Path(work))
                rows.append(r)
                print(f"{side:6s} seed {seed}: solved={r['solved']} at {r['env_steps']} steps, "
                      f"{r['wall_s']:.1f} s (grid ends {r['grid_steps'][-1]} steps at "
                      f"{r['grid_wall_s'][-1]:.1f} s)", flush=True)
    out = summarise(rows, args)
    out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                                   text=True).stdout.strip()
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from stats import json_safe

    Path(args.out).write_text(json.dumps(json_safe(out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
