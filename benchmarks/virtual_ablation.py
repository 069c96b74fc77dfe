"""Stellaris' ablations (§7.3-7.4, Fig. 11a, 11b, 13) at the paper's scale, on the virtual-time
cluster (``dask_rl.virtual``).

Every run is PPO on Hopper-v5 (``pipelines/ppo_hopper_stellaris.yaml``) trained to
``--env-steps`` (500k) on a virtual cluster of ``--slots`` rollout slots (default 64, the
low end of the paper's: its AWS cluster had 128 CPU actors; a wave of 64 slots is 65k env
steps, so 500k is 7-8 trajectories per slot, where 128 slots would give 4) and L learners
(``--learners``, default 1 4 16 64; the paper ran at most 4 per V100: 8 on AWS, 64 on its
HPC cluster). The learning is real (real environments, real networks, the engine's
parameter actor and strategies); the clock is virtual, so staleness is that cluster's.

Task times, fixed before any run (``calibrate``, written to ``OUT.calibration.json`` and
copied into every results file): a rollout's time is log-normal with the mean and log-spread
of ``--calibrate-n`` single-threaded collections of one trajectory (2 envs x 512 steps)
measured here; a learner's time has the log-spread measured for one single-threaded update,
and its mean is set so that L learners keep pace with the slots, ``mean_learn = balance x
mean_rollout x L / slots`` (``--balance``, default 1: trajectories are learned as fast as
they come, at ``slots / L`` actors per learner; above 1 learners fall behind). Runs compare at
equal env steps; the virtual wall time is reported beside. Deviation: a learner's virtual
time does not grow with the truncation's peers (its ``L - 1`` extra forward passes per epoch);
their measured share of the learner's real compute is reported per row instead (64% at
L = 64, 128 slots, in a 40k-step smoke run at ae52565), so at high L the virtual clock favours
the truncating arms.

Arms (each differs from another only in what it studies):
``stellaris`` (dynamic threshold, staleness-scaled steps, IS truncation rho = 1: the paper's
method), ``stellaris-no-is`` (the same aggregation without truncation: Fig. 11b), ``softsync``
(n = 2), ``ssp`` (bound 3 clocks), ``async`` (every gradient applied at once) and ``sync``
(beside Fig. 11a, which has no sync). Each arm's ``alpha0`` is tuned (``tune``) on seeds
``--tune-seeds`` (never reported) at one L (``--tune-learners``, 16) over ``--alphas``
(0.25, 0.5, 1: the 2-core ablation found 0.25 to 1 best for all but sync; where the best
is at the grid's edge, ``tune`` goes on past it by a factor of 2, at most ``--extend`` times);
``stellaris-no-is`` takes Stellaris' choice (truncation changes the loss, not the step).

Phases, each resumable (every finished run is appended to ``OUT.runs.jsonl`` at once and is
not run again), ``--jobs`` runs at a time (the clock is virtual: parallel runs do not change
any figure but the real seconds):

``calibrate``  the task times;
``tune``       alpha0 per arm;
``report``     every arm at its tuned alpha0, every L, seeds 1..``--seeds`` (Fig. 11a, 11b);
``sensitivity`` Stellaris at ``--tune-learners`` with d in {0.9, 0.96, 0.99}, v in {1, 3, 9},
               rho in {0.5, 1, 2}, one at a time from the paper's (0.96, 3, 1) (Fig. 13;
               the paper's point is the report's Stellaris runs at that L, not run again);
``summary``    tables and plots from what has run.

Figures: the area under the curve (AUC: the mean recent training return over an even grid of
env steps; the primary figure, stated before any run) and the final return (mean recent
return over the last tenth of the budget), each a mean with a t 95% interval over seeds;
mean and p99 staleness per row; the truncation's share of the learner's real time. Contrasts
stated in advance, Welch intervals, Holm-adjusted p within each family: Fig. 11a, Stellaris
minus each of softsync, SSP, async at each L (one family of 3 x len(L)); Fig. 11b, Stellaris
minus Stellaris without truncation at each L (one family of len(L)).

    python benchmarks/virtual_ablation.py calibrate
    python benchmarks/virtual_ablation.py tune --jobs 2
    python benchmarks/virtual_ablation.py report --jobs 2
    python benchmarks/virtual_ablation.py sensitivity --jobs 2
    python benchmarks/virtual_ablation.py summary
    python benchmarks/virtual_ablation.py pilot --jobs 2     # default alpha0, 2 seeds, 1 L

Writes ``benchmarks/results/virtual_ablation.{json,md,png}`` (``--out`` sets the stem).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from stats import holm, json_safe, mean_ci, record_commit, welch  # noqa: E402

PIPELINE = ROOT / "pipelines" / "ppo_hopper_stellaris.yaml"
ARMS = {
    "stellaris": ["aggregation.strategy=stellaris", "learner.is_truncation=true"],
    "stellaris-no-is": ["aggregation.strategy=stellaris", "learner.is_truncation=false"],
    "softsync": ["aggregation.strategy=softsync", "aggregation.n=2",
                 "learner.is_truncation=false"],
    "ssp": ["aggregation.strategy=ssp", "aggregation.bound=3", "learner.is_truncation=false"],
    "async": ["aggregation.strategy=async", "learner.is_truncation=false"],
    "sync": ["aggregation.strategy=sync", "learner.is_truncation=false"],
}
TUNED_WITH = {"stellaris-no-is": "stellaris"}
BASELINES = ("softsync", "ssp", "async")
# name -> (config key, values tried, Stellaris' own value: the pipeline's, checked per run)
SENSITIVITY = {"d": ("aggregation.decay", (0.9, 0.96, 0.99), 0.96),
               "v": ("aggregation.smoothness", (1.0, 3.0, 9.0), 3.0),
               "rho": ("learner.is_rho", (0.5, 1.0, 2.0), 1.0)}
GRID = 50   # points of the AUC's env-step grid


# ---- one run ---------------------------------------------------------------------------------
def run_key(phase: str, arm: str, learners: int, alpha0: float, seed: int, extra: tuple,
            args: argparse.Namespace) -> str:
    tail = "".join(f"/{x}" for x in extra)
    return (f"{phase}/{arm}/L{learners}/A{args.slots}/a{alpha0:g}/s{seed}/e{args.env_steps}"
            f"/b{args.balance:g}{tail}")


def task_times(calibration: dict, learners: int, args: argparse.Namespace):
    from dask_rl.virtual import TaskTime

    r, lr = calibration["rollout"], calibration["learn"]
    rollout = TaskTime(r["mean"], r["log_sigma"])
    learn = TaskTime(args.balance * r["mean"] * learners / args.slots, lr["log_sigma"])
    return rollout, learn


def one_run(spec: dict) -> dict:
    """A run of ``spec`` (picklable: it runs in a process of its own); its record."""
    import torch

    from dask_rl.api import resolve
    from dask_rl.virtual import VirtualCluster

    torch.set_num_threads(1)
    args = argparse.Namespace(**spec["args"])
    overrides = [*ARMS[spec["arm"]], f"aggregation.alpha0={spec['alpha0']}",
                 f"seed={spec['seed']}", f"stop.env_steps={args.env_steps}",
                 f"learner.max_learners={spec['learners']}", *spec["extra"]]
    cfg = resolve(PIPELINE, overrides)
    rollout, learn = task_times(spec["calibration"], spec["learners"], args)
    t0 = time.perf_counter()
    r = VirtualCluster(cfg, slots=args.slots, rollout_time=rollout, learn_time=learn,
                       seed=spec["seed"]).run()
    pushes = [p for p in r["pushes"] if p["status"] != "rejected"]
    curve = [(p["env_steps"], p["return_recent"]) for p in pushes
             if p["return_recent"] is not None]
    stale = np.array([p["staleness"] for p in pushes])
    learn_s = np.array([p.get("learn_s", np.nan) for p in pushes])
    cross_s = np.array([p.get("cross_forward_s", 0.0) + p.get("cross_exchange_s", 0.0)
                        for p in pushes])
    return {"key": spec["key"], "phase": spec["phase"], "arm": spec["arm"],
            "learners": spec["learners"], "alpha0": spec["alpha0"], "seed": spec["seed"],
            "extra": list(spec["extra"]), "slots": args.slots, "env_steps": args.env_steps,
            "balance": args.balance,
            "auc": auc(curve, args.env_steps), "final": final(curve, args.env_steps),
            "staleness_mean": float(stale.mean()), "staleness_p99": float(
                np.quantile(stale, 0.99)), "staleness_max": int(stale.max()),
            "policy_lag_mean": float(np.mean([p["policy_lag"] for p in pushes])),
            "virtual_s": r["summary"]["virtual_s"], "real_s": time.perf_counter() - t0,
            "updates": r["summary"]["updates"], "pushes": len(pushes),
            "learn_s_mean": float(np.nanmean(learn_s)),
            "truncation_share": float(np.nansum(cross_s) / np.nansum(learn_s)),
            "cross_policies_mean": float(np.mean([p.get("cross_policies", 0) for p in pushes])),
            "is_truncated_frac": float(np.mean([p.get("is_truncated_frac", 0.0)
                                                for p in pushes])),
            "actor": {k: v for k, v in r["actor"].items() if not isinstance(v, list)},
            "cluster": r["cluster"], "config": r["config"], "commit": _commit(),
            "curve": [(int(x), round(y, 1)) for x, y in curve[:: max(1, len(curve) // 200)]]}


def auc(curve: list, env_steps: int) -> float | None:
    """Mean recent return on an even grid of env steps (the first record carried back)."""
    if not curve:
        return None
    x, y = np.array(curve, np.float64).T
    return float(np.interp(np.linspace(0, env_steps, GRID), x, y).mean())


def final(curve: list, env_steps: int) -> float | None:
    """Mean recent return over the last tenth of the budget."""
    tail = [y for x, y in curve if x >= 0.9 * env_steps]
    return float(np.mean(tail)) if tail else (curve[-1][1] if curve else None)


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "unknown"


# ---- calibration -------------------------------------------------------------------------------
def calibrate(n: int, pipeline: Path = PIPELINE) -> dict:
    """Single-threaded times of one rollout and one update of ``pipeline``, measured here."""
    import torch

    from dask_rl.algos import registry
    from dask_rl.api import resolve
    from dask_rl.data import PolicySnapshot
    from dask_rl.envs import env_spaces
    from dask_rl.roles.collector import Collector
    from dask_rl.roles.learner import Learner
    from dask_rl.runtime.driver import initial_parameters

    torch.set_num_threads(1)
    cfg = resolve(pipeline, [])
    params, moments = initial_parameters(cfg, registry.build(cfg.algo))
    snapshot = PolicySnapshot(0, params, moments)
    collector = Collector(cfg, seed=0)
    collector.load(snapshot)
    learner = Learner(cfg, *env_spaces(cfg.env))
    rollout_s, learn_s = [], []
    for i in range(n + 2):   # the first two warm up
        t0 = time.perf_counter()
        traj = collector.collect(cfg.rollout.steps)
        t1 = time.perf_counter()
        learner.update(snapshot, traj, lr=cfg.learner.lr, seed=i)
        t2 = time.perf_counter()
        if i >= 2:
            rollout_s.append(t1 - t0)
            learn_s.append(t2 - t1)

    def fit(x):
        x = np.asarray(x)
        return {"mean": float(x.mean()), "log_sigma": float(np.log(x).std(ddof=1)),
                "n": int(x.size), "samples": x.round(5).tolist()}

    return {"rollout": fit(rollout_s), "learn": fit(learn_s), "torch_threads": 1,
            "pipeline": str(Path(pipeline).resolve().relative_to(ROOT)), "commit": _commit()}


# ---- phases --------------------------------------------------------------------------------------
def load_runs(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in (json.loads(x) for x in path.read_text().splitlines()
                                  if x.strip())}


def execute(plan: list[tuple], args: argparse.Namespace, calibration: dict) -> None:
    """Run each ``(phase, arm, learners, alpha0, seed, extra)`` not yet in the runs file."""
    runs_path = args.out.with_suffix(".runs.jsonl")
    done = load_runs(runs_path)
    specs = []
    for phase, arm, learners, alpha0, seed, extra in plan:
        key = run_key(phase, arm, learners, alpha0, seed, extra, args)
        if key not in done:
            specs.append({"key": key, "phase": phase, "arm": arm, "learners": learners,
                          "alpha0": alpha0, "seed": seed, "extra": list(extra),
                          "calibration": calibration,
                          "args": {"slots": args.slots, "env_steps": args.env_steps,
                                   "balance": args.balance}})
    print(f"{len(plan) - len(specs)} of {len(plan)} runs done; {len(specs)} to go, "
          f"{args.jobs} at a time", flush=True)
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        futures = [pool.submit(one_run, s) for s in specs]
        for i, fut in enumerate(concurrent.futures.as_completed(futures)):
            r = fut.result()
            with runs_path.open("a") as f:
                f.write(json.dumps(json_safe(r)) + "\n")
            print(f"[{i + 1}/{len(specs)}] {r['key']}: auc {r['auc']:.0f} final "
                  f"{r['final']:.0f} staleness {r['staleness_mean']:.1f} (p99 "
                  f"{r['staleness_p99']:.0f}) virtual {r['virtual_s']:.0f} s real "
                  f"{r['real_s']:.0f} s ({time.time() - t0:.0f} s in)", flush=True)


def tune_scores(runs: dict[str, dict], args: argparse.Namespace) -> dict[str, dict]:
    """Each tuned arm's mean AUC over the tuning seeds, per alpha0 tried on every one of them."""
    out: dict[str, dict] = {}
    for arm in ARMS:
        if arm in TUNED_WITH:
            continue
        by_alpha: dict[float, list] = {}
        for r in runs.values():
            if r["phase"] == "tune" and r["arm"] == arm and r["learners"] == args.tune_learners:
                by_alpha.setdefault(r["alpha0"], []).append(r["auc"])
        scores = {a: float(np.mean(v)) for a, v in sorted(by_alpha.items())
                  if len(v) == len(args.tune_seeds)}
        if scores:
            out[arm] = scores
    return out


def tuned_alphas(runs: dict[str, dict], args: argparse.Namespace) -> dict[str, float]:
    """Each arm's alpha0 with the best mean AUC over the tuning seeds (every alpha0 tried)."""
    out = {arm: max(scores, key=scores.get) for arm, scores in tune_scores(runs, args).items()}
    for arm, source in TUNED_WITH.items():
        if source in out:
            out[arm] = out[source]
    return out


def edge_extensions(runs: dict[str, dict], args: argparse.Namespace) -> list[tuple]:
    """Tuning runs that move an arm's grid past its edge: where the best alpha0 is the
    smallest (largest) tried, the next one down (up) by a factor of 2."""
    plan = []
    for arm, scores in tune_scores(runs, args).items():
        if arm not in args.arms or len(scores) < 2:
            continue
        best, tried = max(scores, key=scores.get), sorted(scores)
        nxt = best / 2 if best == tried[0] else best * 2 if best == tried[-1] else None
        if nxt is not None:
            plan += [("tune", arm, args.tune_learners, nxt, s, ()) for s in args.tune_seeds]
    return plan


def plan_for(phase: str, runs: dict, args: argparse.Namespace) -> list[tuple]:
    if phase == "tune":
        return [("tune", arm, args.tune_learners, a, s, ()) for arm in args.arms
                if arm not in TUNED_WITH for a in args.alphas for s in args.tune_seeds]
    if phase == "pilot":
        return [("pilot", arm, args.tune_learners, 1.0, s, ()) for arm in args.arms
                for s in args.tune_seeds]
    alphas = tuned_alphas(runs, args)
    missing = [a for a in ARMS if a not in alphas]
    if missing:
        raise SystemExit(f"{phase}: no tuned alpha0 for {', '.join(missing)}: run tune first")
    seeds = range(1, args.seeds + 1)
    if phase == "report":
        return [("report", arm, L, alphas[arm], s, ()) for L in args.learners
                for arm in args.arms for s in seeds]
    if phase == "sensitivity":  # the paper's values are the report's Stellaris runs
        return [("sensitivity", "stellaris", args.tune_learners, alphas["stellaris"], s,
                 (f"{key}={value:g}",)) for key, values, paper in SENSITIVITY.values()
                for value in values if value != paper for s in seeds]
    raise SystemExit(f"unknown phase {phase}")


# ---- summary -------------------------------------------------------------------------------------
def _setting(config: dict, key: str):
    """A dotted key's value in a run's recorded config."""
    for part in key.split("."):
        config = config[part]
    return config


def summarise(runs: dict, args: argparse.Namespace, calibration: dict) -> dict:
    rows, contrasts_a, contrasts_b = [], [], []
    report = [r for r in runs.values() if r["phase"] == "report"]
    pilot = [r for r in runs.values() if r["phase"] == "pilot"]

    def row(group: list[dict], **labels) -> dict:
        def ci(key):
            vals = [r[key] for r in group if r[key] is not None]
            return list(mean_ci(vals)) if vals else None
        return {**labels, "n": len(group), "seeds": sorted(r["seed"] for r in group),
                "alpha0": group[0]["alpha0"], "auc": ci("auc"),
                "final": ci("final"), "staleness_mean": ci("staleness_mean"),
                "staleness_p99": ci("staleness_p99"), "policy_lag_mean": ci("policy_lag_mean"),
                "virtual_s": ci("virtual_s"), "real_s": ci("real_s"),
                "truncation_share": ci("truncation_share"), "updates": ci("updates")}

    for source, label in ((report, "report"), (pilot, "pilot")):
        for L in sorted({r["learners"] for r in source}):
            for arm in ARMS:
                group = [r for r in source if r["arm"] == arm and r["learners"] == L]
                if group:
                    rows.append(row(group, phase=label, arm=arm, learners=L))
    for L in sorted({r["learners"] for r in report}):
        def aucs(arm):
            return [r["auc"] for r in report if r["arm"] == arm and r["learners"] == L]
        for base in BASELINES:
            if len(aucs("stellaris")) > 1 and len(aucs(base)) > 1:
                contrasts_a.append({"learners": L, "vs": base,
                                    **welch(aucs("stellaris"), aucs(base))})
        if len(aucs("stellaris")) > 1 and len(aucs("stellaris-no-is")) > 1:
            contrasts_b.append({"learners": L, "vs": "stellaris-no-is",
                                **welch(aucs("stellaris"), aucs("stellaris-no-is"))})
    for family in (contrasts_a, contrasts_b):
        for c, p in zip(family, holm([c["p"] for c in family]) if family else []):
            c["p_holm"] = p
    grid = np.linspace(0, args.env_steps, GRID)
    curves = []
    for source in (report, pilot):
        for L in sorted({r["learners"] for r in source}):
            for arm in ARMS:
                group = [r for r in source if r["arm"] == arm and r["learners"] == L
                         and r["curve"]]
                if len(group) > 1:
                    ys = np.array([np.interp(grid, *np.array(r["curve"], np.float64).T)
                                   for r in group])
                    cis = [mean_ci(col) for col in ys.T]
                    curves.append({"phase": group[0]["phase"], "learners": L, "arm": arm,
                                   "n": len(group), "env_steps": grid.tolist(),
                                   "mean": [c[0] for c in cis], "lo": [c[1] for c in cis],
                                   "hi": [c[2] for c in cis]})
    sens = [r for r in runs.values() if r["phase"] == "sensitivity"]
    sens_rows = []
    sens_seeds = {r["seed"] for r in sens}  # the paper's point on the same seeds as the rest
    for name, (key, values, paper) in SENSITIVITY.items():
        for value in values:
            group = [r for r in sens if r["extra"] == [f"{key}={value:g}"]]
            if value == paper:
                group = [r for r in report if r["arm"] == "stellaris"
                         and r["learners"] == args.tune_learners and r["seed"] in sens_seeds
                         and _setting(r["config"], key) == value]
            if group:
                sens_rows.append(row(group, parameter=name, value=value))
    return {"benchmark": "virtual_ablation",
            "settings": {"pipeline": str(PIPELINE.relative_to(ROOT)), "slots": args.slots,
                         "learners": args.learners, "env_steps": args.env_steps,
                         "balance": args.balance, "seeds": args.seeds,
                         "tune_seeds": args.tune_seeds, "tune_learners": args.tune_learners,
                         "alphas": args.alphas, "arms": ARMS},
            "calibration": {k: ({kk: vv for kk, vv in v.items() if kk != "samples"}
                                if isinstance(v, dict) else v) for k, v in calibration.items()},
            "tune_auc": tune_scores(runs, args), "tuned_alpha0": tuned_alphas(runs, args),
            "rows": rows,
            "fig11a_contrasts": contrasts_a, "fig11b_contrasts": contrasts_b,
            "sensitivity": sens_rows, "curves": curves,
            "configs": {r["key"]: r["config"] for r in list(runs.values())[:1]},
            "runs": len(runs)}


def fmt(ci) -> str:
    if ci is None:
        return "-"
    m, lo, hi = ci
    return f"{m:.0f}" if not np.isfinite(lo) else f"{m:.0f} [{lo:.0f}, {hi:.0f}]"


def write_outputs(result: dict, out: Path) -> None:
    path = out.with_suffix(".json")
    path.write_text(json.dumps(json_safe(result), indent=1))
    record_commit(path)
    s = result["settings"]
    lines = ["# Stellaris' ablations on the virtual-time cluster", "",
             f"PPO Hopper-v5, {s['slots']} rollout slots, {s['env_steps']} env steps, balance "
             f"{s['balance']:g}; tuned alpha0 {result['tuned_alpha0']}.", "",
             "| phase | L | arm | n | alpha0 | AUC | final | staleness mean | p99 | policy lag "
             "| updates | virtual s | truncation share |", "|" + "---|" * 13]
    for r in result["rows"]:
        share = r["truncation_share"][0] if r["truncation_share"] else 0.0
        lines.append(f"| {r['phase']} | {r['learners']} | {r['arm']} | {r['n']} | "
                     f"{r['alpha0']:g} | {fmt(r['auc'])} | {fmt(r['final'])} | "
                     f"{r['staleness_mean'][0]:.1f} | {r['staleness_p99'][0]:.0f} | "
                     f"{r['policy_lag_mean'][0]:.1f} | {r['updates'][0]:.0f} | "
                     f"{r['virtual_s'][0]:.0f} | {share:.2f} |")
    for title, family in (("Fig. 11a: Stellaris minus baseline (AUC)", "fig11a_contrasts"),
                          ("Fig. 11b: truncation on minus off (AUC)", "fig11b_contrasts")):
        if result[family]:
            lines += ["", f"## {title}", "", "| L | vs | diff [95% CI] | p | p (Holm) |",
                      "|---|---|---|---|---|"]
            for c in result[family]:
                lines.append(f"| {c['learners']} | {c['vs']} | {c['diff']:.0f} "
                             f"[{c['ci95'][0]:.0f}, {c['ci95'][1]:.0f}] | {c['p']:.3f} | "
                             f"{c['p_holm']:.3f} |")
    if result["sensitivity"]:
        lines += ["", "## Fig. 13: sensitivity (Stellaris)", "",
                  "| parameter | value | n | AUC | final | staleness mean |",
                  "|---|---|---|---|---|---|"]
        for r in result["sensitivity"]:
            lines.append(f"| {r['parameter']} | {r['value']:g} | {r['n']} | {fmt(r['auc'])} | "
                         f"{fmt(r['final'])} | {r['staleness_mean'][0]:.1f} |")
    if result["tune_auc"]:
        alphas = sorted({a for v in result["tune_auc"].values() for a in map(float, v)})
        lines += ["", f"## Tuning: mean AUC over seeds {s['tune_seeds']} at L = "
                      f"{s['tune_learners']}", "",
                  "| arm | " + " | ".join(f"alpha0 {a:g}" for a in alphas) + " | chosen |",
                  "|---|" + "---|" * (len(alphas) + 1)]
        for arm, scores in result["tune_auc"].items():
            scores = {float(a): v for a, v in scores.items()}
            cells = [f"{scores[a]:.0f}" if a in scores else "-" for a in alphas]
            lines.append(f"| {arm} | " + " | ".join(cells)
                         + f" | {result['tuned_alpha0'][arm]:g} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if result["curves"]:
        plot(result, out.with_suffix(".png"))


def plot(result: dict, path: Path) -> None:
    """Mean training return against env steps (t 95% band over seeds), a panel per L."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c["phase"], c["learners"]) for c in result["curves"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (phase, L) in zip(axes[0], panels):
        for c in (c for c in result["curves"] if (c["phase"], c["learners"]) == (phase, L)):
            x = np.array(c["env_steps"]) / 1e3
            lo, hi = np.array(c["lo"], float), np.array(c["hi"], float)
            (line,) = ax.plot(x, c["mean"], label=f"{c['arm']} (n={c['n']})")
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set(title=f"{phase}: L = {L}, {result['settings']['slots']} slots",
               xlabel="env steps (k)", ylabel="recent training return")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase", choices=["calibrate", "tune", "report", "sensitivity", "summary",
                                     "pilot"])
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--learners", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--tune-learners", type=int, default=16)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--tune-seeds", type=int, nargs="+", default=[101, 102])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--env-steps", type=int, default=500_000)
    p.add_argument("--balance", type=float, default=1.0)
    p.add_argument("--calibrate-n", type=int, default=30)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                   help="the arms to run (tune, report, pilot); the summary covers all")
    p.add_argument("--extend", type=int, default=2,
                   help="tune: times an arm whose best alpha0 sits at its grid's edge is "
                        "extended past it (x2 or /2)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "virtual_ablation")
    args = p.parse_args()
    cal_path = args.out.with_suffix(".calibration.json")
    if args.phase == "calibrate" or not cal_path.exists():
        if cal_path.exists():
            raise SystemExit(f"{cal_path} exists: the task times are fixed; delete it to "
                             f"measure again (and rerun everything)")
        cal_path.write_text(json.dumps(calibrate(args.calibrate_n), indent=1))
        print(cal_path.read_text()[:400])
        if args.phase == "calibrate":
            return
    calibration = json.loads(cal_path.read_text())
    runs = load_runs(args.out.with_suffix(".runs.jsonl"))
    if args.phase != "summary":
        execute(plan_for(args.phase, runs, args), args, calibration)
        runs = load_runs(args.out.with_suffix(".runs.jsonl"))
    for _ in range(args.extend if args.phase == "tune" else 0):
        plan = edge_extensions(runs, args)
        if not plan:
            break
        execute(plan, args, calibration)
        runs = load_runs(args.out.with_suffix(".runs.jsonl"))
    write_outputs(summarise(runs, args, calibration), args.out)
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
