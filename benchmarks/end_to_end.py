"""End to end: env steps per second with learning on, dask-rl on 2 workers against one plain
process running the same code with both cores for its torch work.

Two sides, each a fresh Python process, the same pipeline, seed and env-step budget:

- **plain**: one process, ``torch.set_num_threads(2)`` (both cores for every forward and
  backward pass), the loop a CleanRL-style script runs, built from dask-rl's own parts:
  ``Collector.collect`` -> ``Learner.update`` -> ``ParameterActor.push``, one learner,
  ``aggregation.strategy: sync`` (a plain PPO loop: each update on the newest policy);
- **dask-rl**: the pipeline as ``dask-rl train`` runs it (the warm worker process, the
  pipeline's embedded 2-worker ``LocalCluster``, its strategy and learners; one torch thread
  per worker, as Dask's workers start).

Measured on both sides the same way: each learned trajectory's (wall time, env steps, recent
training return: the mean of the last 20 finished episodes' undiscounted returns, as the
progress bar shows it). **Env steps/s** is the steps learned after the first trajectory over
the wall time from its end to the last (start-up, the first collection and the first learning
out on both sides: the loop's rate). **Time to a return** (``--target``, e.g. Hopper's 1,000):
the wall time from the first task's start until the recent training return first reaches
it, judged from the same episode stream on both sides; the two sides then differ also in
their learning rule (asynchronous learners against a plain loop), which is what a user
choosing between them gets. A run that does not reach it within the budget is censored.

    python benchmarks/end_to_end.py --pipeline pipelines/ppo_hopper_stellaris.yaml \\
        --budget 122880 --repeats 5 --target 1000
    python benchmarks/end_to_end.py --pipeline pipelines/ppo_pong.yaml --budget 10240 \\
        --repeats 5

Repeats alternate which side goes first. Writes ``benchmarks/results/end_to_end_<env>.json``
with the commit, every run's effective config and curve, and the ratio's mean with its 95%
t interval over repeats (each repeat's ratio: one seed, both sides side by side).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ROOT = HERE.parent
RECENT = 20          # episodes in the recent training return (the progress bar's)
PLAIN_THREADS = 2    # the plain process's torch threads: both cores


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def _config(pipeline: str, seed: int, budget: int, side: str, overrides: list[str]):
    from dask_rl.api import resolve

    extra = (["aggregation.strategy=sync", "learner.max_learners=1"] if side == "plain"
             else [])
    return resolve(pipeline, [f"seed={seed}", f"stop.env_steps={budget}",
                              "stop.solve_on_target=false", "stop.eval_every_updates=0",
                              "checkpoint.every_s=0", *extra, *overrides])


# ---- the sides, each in its own process (``--side``) -------------------------------------------
def plain_side(args, out: Path) -> None:
    """The pipeline's algorithm in this process: rollout, learn, apply, repeat."""
    import torch

    from dask_rl.algos import registry
    from dask_rl.control.schedule import learning_rate
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat
    from dask_rl.models.normalizer import empty_moments
    from dask_rl.roles.collector import Collector
    from dask_rl.roles.learner import Learner
    from dask_rl.runtime.parameter_actor import ParameterActor

    torch.set_num_threads(PLAIN_THREADS)
    cfg = _config(args.pipeline, args.seed, args.budget, "plain", args.overrides)
    spaces = env_spaces(cfg.env)
    algorithm = registry.build(cfg.algo)
    model = algorithm.make_model(*spaces, cfg.model, normalize_obs=cfg.env.normalize_obs,
                                 seed=cfg.seed)
    moments = {}
    if cfg.env.normalize_obs:
        moments["obs"] = empty_moments(int(np.prod(spaces[0].shape)))
    if cfg.env.normalize_reward:
        moments["return"] = empty_moments(1)
    actor = ParameterActor(get_flat(model), cfg.aggregation, moments=moments or None,
                           learners=1)
    collector = Collector(cfg, seed=cfg.seed)
    learner = Learner(cfg, *spaces)
    returns: collections.deque[float] = collections.deque(maxlen=RECENT)
    curve, steps, first_start = [], 0, time.time()
    times: dict[str, list[float]] = {"collect_s": [], "learn_s": []}
    while steps < args.budget:
        snap = actor.pull()
        collector.load(snap)
        traj = collector.collect(cfg.rollout.steps)
        lr = learning_rate(cfg.learner.lr, anneal=cfg.learner.anneal_lr, env_steps=steps,
                           total_env_steps=args.budget)
        t0 = time.perf_counter()
        res = learner.update(actor.pull_learner("L", opt_state=True), traj, lr=lr,
                             seed=snap.version)
        actor.push(res.delta, res.version, "L", opt_state=res.opt_state, moments=traj.moments,
                   samples=traj.env_steps)
        times["collect_s"].append(traj.collect_s)
        times["learn_s"].append(time.perf_counter() - t0)
        steps += traj.env_steps
        returns.extend(float(r) for r in traj.episode_returns)
        curve.append((time.time(), steps, float(np.mean(returns)) if returns else None))
    _save(out, cfg, curve, first_start, torch_threads=torch.get_num_threads(),
          task_times_median={k: float(np.median(v)) for k, v in times.items()})


def dask_side(args, out: Path) -> None:
    """The pipeline as ``dask-rl train`` runs it; each learner report is a point."""
    from dask_rl.runtime.worker_start import warm_start

    warm_start()
    from dask_rl.runtime.cluster import connect
    from dask_rl.runtime.driver import Driver

    cfg = _config(args.pipeline, args.seed, args.budget, "dask", args.overrides)
    marks: dict = {}
    curve: list = []

    class Timed(Driver):
        def _launch(self):   # the first task that collects
            super()._launch()
            if len(self.inflight):
                marks.setdefault("first_start", time.time())

    def progress(p):
        if p.env_steps > (curve[-1][1] if curve else 0):
            curve.append((time.time(), p.env_steps, p.recent_return))

    with connect(cfg.cluster) as client, tempfile.TemporaryDirectory() as run_dir:
        threads = client.run(lambda: __import__("torch").get_num_threads())
        summary = Timed(client, cfg, run_dir, progress=progress).run()
        learned = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    learned = [r for r in learned if r.get("kind") == "learner"]
    # per task, as the plain side's: the collection, and the learner's pull + learning + push
    times = {"collect_s": [r["rollout/collect_s"] for r in learned],
             "learn_s": [r["learner/task_s"] for r in learned],
             "learner_pull_s": [r["learner/pull_s"] for r in learned],
             "learner_push_s": [r["learner/push_s"] for r in learned],
             "rollout_pull_s": [r["rollout/pull_s"] for r in learned]}
    _save(out, cfg, curve, marks["first_start"], staleness_mean=summary.staleness_mean,
          worker_torch_threads=sorted(threads.values()), fused=cfg.learner.fused,
          task_times_median={k: float(np.median(v)) for k, v in times.items() if v})


def _save(out: Path, cfg, curve, first_start: float, **extra) -> None:
    from dask_rl.config import public_dict

    out.write_text(json.dumps({"config": public_dict(cfg), "first_start": first_start,
                               "curve": curve, **extra}))


# ---- the parent: runs both sides per repeat and compares ---------------------------------------
def measure(side: str, seed: int, args, work: Path) -> dict:
    out = work / f"{side}-{seed}.json"
    spawn = time.time()
    cmd = [sys.executable, __file__, "--side", side, "--seed", str(seed), "--pipeline",
           args.pipeline, "--budget", str(args.budget), "--npz", str(out)]
    for o in args.overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True)
    d = json.loads(out.read_text())
    curve = d.pop("curve")
    (t1, s1, _), (tn, sn, _) = curve[0], curve[-1]
    reached = next((t for t, _, r in curve if r is not None and args.target is not None
                    and r >= args.target), None)
    return {"side": side, "seed": seed, **d,
            "command_s": round(time.time() - spawn, 3),
            "start_s": round(d["first_start"] - spawn, 3),
            "env_steps": sn, "steps_per_s": (sn - s1) / (tn - t1),
            "time_to_target_s": (reached - d["first_start"]) if reached else math.inf,
            "final_recent_return": curve[-1][2],
            "curve": [(round(t - d["first_start"], 3), s, r) for t, s, r in curve]}


def summarise(rows: list[dict], args) -> dict:
    from stats import bootstrap_ratio_ci, mean_ci

    by = {s: {r["seed"]: r for r in rows if r["side"] == s} for s in ("plain", "dask")}
    seeds = sorted(by["plain"])
    ratios = [by["dask"][s]["steps_per_s"] / by["plain"][s]["steps_per_s"] for s in seeds]
    m, lo, hi = mean_ci(ratios)
    out = {"steps_per_s_ratio": {"mean": m, "ci95": [lo, hi], "per_repeat": ratios}}
    for side, mine in by.items():
        v = [r["steps_per_s"] for r in mine.values()]
        sm, slo, shi = mean_ci(v)
        out[side] = {"steps_per_s": {"mean": sm, "ci95": [slo, shi]},
                     "start_s_median": float(np.median([r["start_s"] for r in mine.values()])),
                     "reached_target": sum(math.isfinite(r["time_to_target_s"])
                                           for r in mine.values())}
    if args.target is not None:
        t_d = [by["dask"][s]["time_to_target_s"] for s in seeds]
        t_p = [by["plain"][s]["time_to_target_s"] for s in seeds]
        censored = [side for side, t in (("dask", t_d), ("plain", t_p))
                    if not math.isfinite(float(np.median(t)))]
        # a side whose median run never reached the target has no median time: no ratio
        # (dividing by its inf would print 0 as if dask-rl took no time)
        ratio, lo, hi = (None, None, None) if censored else bootstrap_ratio_ci(t_d, t_p,
                                                                                np.median)
        out["time_to_target_ratio_median"] = {"ratio": ratio, "ci95": [lo, hi],
                                              "median_censored": censored,
                                              "dask_s": t_d, "plain_s": t_p}
    return out



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default=str(ROOT / "pipelines" / "ppo_hopper_stellaris.yaml"))
    ap.add_argument("--budget", type=int, default=122_880, help="env steps per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=201,
                    help="seeds first-seed, first-seed+1, ... (none used to tune anything)")
    ap.add_argument("--target", type=float, default=None,
                    help="a recent training return whose first crossing is timed")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="a pipeline override for both sides")
    ap.add_argument("--out", default=None)
    ap.add_argument("--side", choices=("plain", "dask"))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--npz")
    args = ap.parse_args()
    if args.side == "plain":
        plain_side(args, Path(args.npz))
        return 0
    if args.side == "dask":
        dask_side(args, Path(args.npz))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for k in range(args.repeats):
            seed = args.first_seed + k
            for side in (("plain", "dask") if k % 2 == 0 else ("dask", "plain")):
                r = measure(side, seed, args, Path(work))
                rows.append(r)
                print(f"{side:5s} seed {seed}: {r['steps_per_s']:.0f} env steps/s, "
                      f"start {r['start_s']:.2f} s, to target {r['time_to_target_s']:.1f} s, "
                      f"recent return {r['final_recent_return']}", flush=True)
    env = rows[0]["config"]["env"]["id"].split("/")[-1].split("-")[0].lower()
    out = {"benchmark": "end_to_end", "commit": _commit(), "pipeline": args.pipeline,
           "command": " ".join(sys.argv),
           "settings": {"budget": args.budget, "repeats": args.repeats,
                        "seeds": [args.first_seed + k for k in range(args.repeats)],
                        "target": args.target, "overrides": args.overrides,
                        "plain_torch_threads": PLAIN_THREADS,
                        "plain_overrides": ["aggregation.strategy=sync",
                                            "learner.max_learners=1"]},
           "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
           **summarise(rows, args), "rows": rows}
    print(json.dumps({k: v for k, v in out.items() if k not in ("rows",)}, indent=1,
                     default=str)[:3000])
    path = Path(args.out or HERE / "results" / f"end_to_end_{env}.json")
    from stats import json_safe

    path.write_text(json.dumps(json_safe(out), indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
