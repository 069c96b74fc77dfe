"""The virtual-time cluster against the real runtime, where the two overlap: this machine.

For each learner count L of ``--learners`` (default 1, 2, 4) and each seed of ``--seeds``
(1..5), PPO on Hopper-v5 (``pipelines/ppo_hopper_stellaris.yaml``: Stellaris, IS truncation)
trains for ``--env-steps`` (100k) twice:

* **real**: ``dask_rl.train`` on an embedded LocalCluster of 2 worker processes with 4
  threads each, so that no task waits for a thread (4 rollout slots and up to 2 learners
  apart; at L = 4 the tasks are fused, and each slot's queued task collects while its
  running one learns), ``learner.max_learners = L``; no evaluations during the run, no
  checkpoints. Its metrics give every push's staleness (``PushAck.staleness``: the
  actor's version at arrival minus the version the learner pulled), the learning curve
  (recent training return against env steps learned) and the task times: a rollout's
  ``rollout/pull_s + rollout/collect_s`` and a learner's ``learner/task_s`` (pull, learn,
  push).
* **virtual**: :class:`dask_rl.virtual.VirtualCluster` with the run's effective config, as
  many slots as the real run had, and the real run's own task times as its distributions
  (:meth:`TaskTime.measured`: drawn with replacement; the clock's seed is the run's seed).

* **virtual, shared cores**: the same, but the tasks share the machine's 2 cores
  (``VirtualCluster(cores=2)``: processor sharing) and each task's *work* is drawn from
  ``--calibrate-n`` single-threaded, uncontended rollouts and updates of the pipeline
  measured here first (``virtual_ablation.calibrate``), so that a task's time follows what
  runs beside it, as it does here.

The first virtual side is given the marginal task times only: not their correlations (on 2
cores a learner's time is set by what runs beside it), the driver's dispatch gaps between
tasks, or a task's wait for a thread; the second models the sharing but not the driver's,
the scheduler's and the actor's own use of the cores. Reported per L: the staleness
quantiles (10, 25, 50, 75, 90, 99%) of the pooled pushes of each side, the largest
difference (the target: every quantile within 1 version), the two-sample KS D with both
sizes and its p; the learning curve on an even grid of env steps, each side's mean with a t
95% interval over the seeds, and at how many grid points the virtual mean lies inside the
real interval; the virtual wall time against the real training time (the run's ``wall_s``,
start-up excluded).

    python benchmarks/emulator_validation.py                 # ~25 min on 2 cores
    python benchmarks/emulator_validation.py --quick --out /tmp/ev   # a smoke run

Every finished pair is appended to ``OUT.runs.jsonl`` at once (a run there is not redone);
writes ``benchmarks/results/emulator_validation.{json,md,png}`` (``--out`` sets the stem).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from stats import json_safe, mean_ci, record_commit, welch  # noqa: E402

PIPELINE = ROOT / "pipelines" / "ppo_hopper_stellaris.yaml"
SLOTS = 4
THREADS = 4
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
GRID_POINTS = 10
CORES = 2
SIDES = {"virtual": "virtual, real task times", "shared": "virtual, shared cores"}


def overrides(learners: int, seed: int, env_steps: int) -> list[str]:
    return [f"seed={seed}", f"stop.env_steps={env_steps}", "stop.eval_every_updates=0",
            "stop.target_return=1e9", "stop.solve_on_target=false", "stop.eval_episodes=1",
            "checkpoint.every_s=0", "cluster.n_workers=2",
            f"cluster.threads_per_worker={THREADS}", "cluster.dashboard=false",
            f"learner.max_learners={learners}", f"rollout.slots={SLOTS}"]


def real_run(learners: int, seed: int, env_steps: int) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        res = dask_rl.train(PIPELINE, run_dir=Path(tmp) / "run",
                            overrides=overrides(learners, seed, env_steps))
        records = read_metrics(Path(tmp) / "run" / "metrics.jsonl")
    pushes = [r for r in records if r["kind"] == "learner" and r.get("status") != "rejected"]
    return {"config": next(r["config"] for r in records
                           if r["kind"] == "run" and r["event"] == "start"),
            "slots": res.summary["rollout_slots"], "wall_s": res.summary["wall_s"],
            "staleness": [int(p["staleness"]) for p in pushes],
            "rollout_s": [p["rollout/pull_s"] + p["rollout/collect_s"] for p in pushes],
            "learn_s": [p["learner/task_s"] for p in pushes],
            "curve": [(p["env_steps"], p["charts/return_recent"]) for p in pushes
                      if p.get("charts/return_recent") is not None]}


def virtual_run(real: dict, learners: int, seed: int, env_steps: int,
                work: dict | None = None) -> dict:
    """The emulator with the real run's task times, or (``work``: calibrated single-thread
    samples) with the work of each task on this machine's 2 shared cores."""
    from dask_rl.api import resolve
    from dask_rl.virtual import TaskTime, VirtualCluster

    cfg = resolve(PIPELINE, overrides(learners, seed, env_steps))
    rollout, learn = ((real["rollout_s"], real["learn_s"]) if work is None
                      else (work["rollout"]["samples"], work["learn"]["samples"]))
    cluster = VirtualCluster(cfg, slots=real["slots"], seed=seed,
                             cores=None if work is None else CORES,
                             rollout_time=TaskTime.measured(rollout),
                             learn_time=TaskTime.measured(learn))
    r = cluster.run()
    pushes = [p for p in r["pushes"] if p["status"] != "rejected"]
    return {"cluster": r["cluster"], "virtual_s": r["summary"]["virtual_s"],
            "real_s": r["summary"]["real_s"],
            "staleness": [int(p["staleness"]) for p in pushes],
            "curve": [(p["env_steps"], p["return_recent"]) for p in pushes
                      if p["return_recent"] is not None]}


# ---- analysis ------------------------------------------------------------------------------------
def on_grid(curve: list, grid: np.ndarray) -> np.ndarray:
    x, y = np.array(curve, np.float64).T
    return np.interp(grid, x, y)


def compare(pairs: list[dict], env_steps: int, side: str) -> dict:
    from scipy import stats as scipy_stats

    real = np.concatenate([p["real"]["staleness"] for p in pairs])
    virt = np.concatenate([p[side]["staleness"] for p in pairs])
    qr, qv = np.quantile(real, QUANTILES), np.quantile(virt, QUANTILES)
    ks = scipy_stats.ks_2samp(real, virt)
    grid = np.linspace(env_steps / GRID_POINTS, env_steps, GRID_POINTS)
    cr = np.array([on_grid(p["real"]["curve"], grid) for p in pairs])
    cv = np.array([on_grid(p[side]["curve"], grid) for p in pairs])
    curve = []
    for j, x in enumerate(grid):
        m, lo, hi = mean_ci(cr[:, j])
        mv, lov, hiv = mean_ci(cv[:, j])
        diff = welch(cv[:, j], cr[:, j]) if len(pairs) > 1 else None
        curve.append({"env_steps": float(x), "real": [m, lo, hi], "virtual": [mv, lov, hiv],
                      "virtual_mean_in_real_ci": bool(lo <= mv <= hi),
                      "difference": diff,
                      "difference_ci_has_zero": bool(diff and diff["ci95"][0] <= 0
                                                     <= diff["ci95"][1])})
    wall = [p[side]["virtual_s"] / p["real"]["wall_s"] for p in pairs]
    return {"seeds": [p["seed"] for p in pairs],
            "staleness": {"quantiles": list(QUANTILES), "real": qr.tolist(),
                          "virtual": qv.tolist(),
                          "max_quantile_diff": float(np.max(np.abs(qr - qv))),
                          "within_one_version": bool(np.all(np.abs(qr - qv) <= 1)),
                          "mean": [float(real.mean()), float(virt.mean())],
                          "ks_d": float(ks.statistic), "ks_p": float(ks.pvalue),
                          "n": [int(real.size), int(virt.size)]},
            "curve": curve,
            "curve_points_in_ci": sum(c["virtual_mean_in_real_ci"] for c in curve),
            "curve_points_difference_has_zero": sum(c["difference_ci_has_zero"]
                                                    for c in curve),
            "virtual_over_real_wall": list(mean_ci(wall))}


def write_outputs(out: Path, args: argparse.Namespace, runs: list[dict], work: dict) -> None:
    by_l = {L: sorted((r for r in runs if r["learners"] == L), key=lambda r: r["seed"])
            for L in args.learners}
    tables = {side: {str(L): compare(rs, args.env_steps, side) for L, rs in by_l.items() if rs}
              for side in SIDES}
    result = {"benchmark": "emulator_validation",
              "settings": {"pipeline": str(PIPELINE.relative_to(ROOT)),
                           "env_steps": args.env_steps, "seeds": args.seeds,
                           "learners": args.learners, "slots": SLOTS,
                           "threads_per_worker": THREADS, "workers": 2},
              "configs": {str(L): rs[0]["real"]["config"] for L, rs in by_l.items() if rs},
              "task_times": {f"L{r['learners']}/s{r['seed']}": r["virtual"]["cluster"]
                             for r in runs},
              "work": {k: ({kk: vv for kk, vv in v.items() if kk != "samples"}
                           if isinstance(v, dict) else v) for k, v in work.items()},
              "cores": CORES, "tables": tables}
    path = out.with_suffix(".json")
    path.write_text(json.dumps(json_safe(result), indent=1))
    record_commit(path)
    lines = ["# Virtual-time cluster vs the real runtime (this machine)", "",
             f"PPO Hopper-v5, Stellaris + IS truncation, {args.env_steps} env steps, seeds "
             f"{args.seeds}, {SLOTS} slots on 2 workers x {THREADS} threads.", "",
             f"Staleness quantiles at {', '.join(f'{q:g}' for q in QUANTILES)}.", "",
             "Curve points: of the grid's, those where the virtual mean lies in the real t "
             "95% interval, and those where the Welch 95% interval of the difference holds "
             "0.", "",
             "| virtual side | L | staleness quantiles real | virtual | max diff | KS D (n real, "
             "n virtual) | mean real / virtual | curve points in CI / difference holds 0 | "
             "virtual / real wall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for side, table in tables.items():
        for L, t in table.items():
            lines.append(row(SIDES[side], L, t))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(out.with_suffix(".png"), tables)


def row(side: str, L: str, t: dict) -> str:
    s = t["staleness"]
    w = t["virtual_over_real_wall"]
    return (f"| {side} | {L} | {' '.join(f'{q:g}' for q in s['real'])} | "
            f"{' '.join(f'{q:g}' for q in s['virtual'])} | {s['max_quantile_diff']:g} | "
            f"{s['ks_d']:.3f} ({s['n'][0]}, {s['n'][1]}) | {s['mean'][0]:.2f} / "
            f"{s['mean'][1]:.2f} | {t['curve_points_in_ci']}/{len(t['curve'])} / "
            f"{t['curve_points_difference_has_zero']}/{len(t['curve'])} | "
            f"{w[0]:.2f} [{w[1]:.2f}, {w[2]:.2f}] |")


def plot(path: Path, tables: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ls = list(tables["virtual"])
    fig, axes = plt.subplots(2, len(ls), figsize=(4.4 * len(ls), 7), squeeze=False)
    for k, L in enumerate(ls):
        first = tables["virtual"][L]
        ax = axes[0, k]
        ax.plot(first["staleness"]["real"], QUANTILES, "o-", label="real")
        for side, style in (("virtual", "s--"), ("shared", "^:")):
            t = tables[side][L]
            ax.plot(t["staleness"]["virtual"], QUANTILES, style,
                    label=f"{SIDES[side]} (KS D {t['staleness']['ks_d']:.2f})")
        ax.set_title(f"L = {L}: staleness quantiles")
        ax.set_xlabel("staleness (versions)")
        ax.legend(fontsize=7)
        ax = axes[1, k]
        x = [c["env_steps"] for c in first["curve"]]
        for side, key, style in (("virtual", "real", "-"), ("virtual", "virtual", "--"),
                                 ("shared", "virtual", ":")):
            m = np.array([c[key] for c in tables[side][L]["curve"]], np.float64)
            ax.plot(x, m[:, 0], style, label="real" if key == "real" else SIDES[side])
            ax.fill_between(x, m[:, 1], m[:, 2], alpha=0.15)
        ax.set_xlabel("env steps")
        ax.set_ylabel("recent training return")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--env-steps", type=int, default=100_000)
    p.add_argument("--calibrate-n", type=int, default=30,
                   help="single-threaded rollouts and updates measured for the shared side")
    p.add_argument("--quick", action="store_true", help="a smoke run: 8k steps, 1 seed")
    p.add_argument("--out", type=Path, default=HERE / "results" / "emulator_validation")
    args = p.parse_args()
    if args.quick:
        args.env_steps, args.seeds, args.learners, args.calibrate_n = 8192, [1], [1, 4], 3
    runs_path = args.out.with_suffix(".runs.jsonl")
    work_path = args.out.with_suffix(".work.json")
    if not work_path.exists():   # measured once, before any run that uses it
        from virtual_ablation import calibrate

        work_path.write_text(json.dumps(calibrate(args.calibrate_n, PIPELINE), indent=1))
    work = json.loads(work_path.read_text())
    done = ([json.loads(x) for x in runs_path.read_text().splitlines() if x.strip()]
            if runs_path.exists() else [])
    keys = {(r["learners"], r["seed"], r["env_steps"]) for r in done}
    for L in args.learners:
        for seed in args.seeds:
            if (L, seed, args.env_steps) in keys:
                continue
            t0 = time.time()
            real = real_run(L, seed, args.env_steps)
            run = {"learners": L, "seed": seed, "env_steps": args.env_steps, "real": real,
                   "virtual": virtual_run(real, L, seed, args.env_steps)}
            with runs_path.open("a") as f:
                f.write(json.dumps(run) + "\n")
            done.append(run)
            print(f"L={L} seed={seed}: staleness mean real {np.mean(real['staleness']):.2f} "
                  f"virtual {np.mean(run['virtual']['staleness']):.2f}, wall real "
                  f"{real['wall_s']:.1f} s virtual {run['virtual']['virtual_s']:.1f} s "
                  f"({time.time() - t0:.0f} s)", flush=True)
    runs = [r for r in done if r["env_steps"] == args.env_steps and r["seed"] in args.seeds
            and r["learners"] in args.learners]
    for r in runs:   # the shared-cores side, added to pairs that lack it
        if "shared" not in r:
            r["shared"] = virtual_run(r["real"], r["learners"], r["seed"], args.env_steps,
                                      work)
            print(f"L={r['learners']} seed={r['seed']}: shared cores staleness mean "
                  f"{np.mean(r['shared']['staleness']):.2f}, virtual "
                  f"{r['shared']['virtual_s']:.1f} s", flush=True)
            runs_path.write_text("".join(json.dumps(x) + "\n" for x in done))
    write_outputs(args.out, args, runs, work)
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
