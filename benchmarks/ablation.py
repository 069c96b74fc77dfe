"""Stellaris' ablation: the aggregation strategies on MuJoCo, at equal wall budgets.

Every run is PPO (``pipelines/ppo_hopper_stellaris.yaml``'s settings, the environment switched
by ``env.id``) on an embedded LocalCluster of 2 worker processes, stopped by wall time only
(``stop.wall_s``), then evaluated greedily on ``--eval-episodes`` episodes. Only the
aggregation strategy (and its tuned ``alpha0``) differs between the sides of a comparison;
strategies take turns within each seed so that machine noise spreads over all of them.
CartPole is left out of the ranking: every strategy reaches its 500 cap there.

Three phases, each resumable (every finished run is appended to ``OUT.runs.jsonl`` at once,
and a run already there is not redone, so a long study can span several sessions):

``tune``
    For each environment and strategy, ``alpha0`` from ``--alphas`` on the tuning seeds
    (``--tune-seeds``, never reported); the one with the best mean area under the curve wins.
    Equal footing for the step: async and SSP apply each gradient whole (TianJi too, scaled
    by ``1 / (1 + lambda P)``), sync, softsync and
    Stellaris average the gradients they buffer (each weighs ``1/H``, Stellaris' scaled by
    staleness too), so the same ``alpha0`` is a smaller step per gradient for them. Tuning
    each strategy's ``alpha0`` over a grid wide enough for both (0.5 to 4) gives each its best
    step; the effective step per applied gradient (``alpha0`` times the mean weight, measured
    by the parameter actor: ``step_per_gradient`` in the summary) is reported beside it.
``report``
    Each strategy at its tuned ``alpha0`` on the report seeds (``--seeds``, default 8, none
    used in tuning), ``--learners`` concurrent learners (default 4).
``staleness``
    The same at 1, 2, 4 and 8 concurrent learners (``--sweep``): how each strategy degrades as
    staleness grows, which is the paper's actual claim.

Figures: the final greedy return and the area under the curve (the mean over the run of the
recent training return, sampled on a grid of wall time: higher means better sooner), each as
a mean with a bootstrap 95% CI, and Welch's t-test of Stellaris against each baseline.

    python benchmarks/ablation.py tune
    python benchmarks/ablation.py report
    python benchmarks/ablation.py staleness --envs Hopper-v5 --seeds 4
    python benchmarks/ablation.py summary        # tables and plot from what has run

Writes ``benchmarks/results/ablation.json`` (every run's effective config, the tuning choice,
the tables) and ``ablation.{md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ROOT = HERE.parent
PIPELINE = ROOT / "pipelines" / "ppo_hopper_stellaris.yaml"
ENVS = ["Hopper-v5", "HalfCheetah-v5"]
STRATEGIES = ["stellaris", "tianji", "async", "ssp", "softsync", "sync"]
STRATEGY_SETTINGS = {
    # the paper's method as specified: decay 0.96, v = 3, global IS truncation (rho = 1)
    "stellaris": ["aggregation.strategy=stellaris", "learner.is_truncation=true"],
    "stellaris-auto": ["aggregation.strategy=stellaris", "aggregation.decay=auto",
                       "learner.is_truncation=true"],
    # TianJi's step alpha0 / (1 + lambda P), P the share of stale samples (lambda 1)
    "tianji": ["aggregation.strategy=tianji", "learner.is_truncation=false"],
    "async": ["aggregation.strategy=async", "learner.is_truncation=false"],
    "ssp": ["aggregation.strategy=ssp", "aggregation.bound=3", "learner.is_truncation=false"],
    "softsync": ["aggregation.strategy=softsync", "aggregation.n=2",
                 "learner.is_truncation=false"],
    "sync": ["aggregation.strategy=sync", "learner.is_truncation=false"],
}
AUC_POINTS = 100


def run_key(phase: str, env_id: str, strategy: str, alpha0: float, learners: int,
            seed: int) -> str:
    return f"{phase}/{env_id}/{strategy}/a{alpha0:g}/L{learners}/s{seed}"


def one_run(phase: str, env_id: str, strategy: str, alpha0: float, learners: int, seed: int,
            args: argparse.Namespace) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    threads = max(2, -(-learners // 2))  # enough threads on 2 workers for every learner
    overrides = [f"env.id={env_id}", *STRATEGY_SETTINGS[strategy],
                 f"aggregation.alpha0={alpha0}", f"seed={seed}",
                 f"stop.wall_s={args.budget_s}", "stop.env_steps=1000000000",
                 "stop.solve_on_target=false", "stop.eval_every_updates=0",
                 # no target: every final evaluation is the same --eval-episodes, unconfirmed
                 "stop.target_return=1e9",
                 f"stop.eval_episodes={args.eval_episodes}", "checkpoint.every_s=0",
                 "cluster.n_workers=2", f"cluster.threads_per_worker={threads}",
                 "cluster.dashboard=false", f"learner.max_learners={learners}"]
    with tempfile.TemporaryDirectory() as tmp:
        res = dask_rl.train(PIPELINE, run_dir=Path(tmp) / "run", overrides=overrides)
        records = read_metrics(Path(tmp) / "run" / "metrics.jsonl")
    s = res.summary
    config = next(r["config"] for r in records if r["kind"] == "run" and r["event"] == "start")
    curve = [(r["wall_s"], r["charts/return_recent"]) for r in records
             if r["kind"] == "learner" and r.get("charts/return_recent") is not None]
    return {"key": run_key(phase, env_id, strategy, alpha0, learners, seed), "phase": phase,
            "env_id": env_id, "strategy": strategy, "alpha0": alpha0, "learners": learners,
            "seed": seed, "budget_s": args.budget_s, "final_return": s["final_return"],
            "auc": auc(curve, args.budget_s), "updates": s["updates"],
            "env_steps": s["env_steps"], "staleness_mean": s["staleness_mean"],
            "staleness_max": s["staleness_max"], "gradients_applied": s["gradients_applied"],
            "gradients_dropped": s["gradients_dropped"],
            "step_per_gradient": s["step_per_gradient"],
            "actor_apply_share": s["actor_apply_share"], "wall_s": s["wall_s"],
            "config": config, "curve": [(round(t, 2), round(y, 1)) for t, y in curve]}


def auc(curve: list[tuple[float, float]], budget_s: float) -> float | None:
    """Mean recent training return over ``[0, budget]`` on an even grid of wall time; before
    the first record the run has no return yet and the first one is carried back."""
    if not curve:
        return None
    t, y = np.array(curve, np.float64).T
    grid = np.linspace(0, budget_s, AUC_POINTS)
    return float(np.interp(grid, t, y).mean())


# ---- bookkeeping -------------------------------------------------------------------------------
def load_runs(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in runs}


def execute(plan: list[tuple], args: argparse.Namespace, runs_path: Path) -> None:
    done = load_runs(runs_path)
    todo = [p for p in plan if run_key(*p) not in done]
    print(f"{len(plan) - len(todo)} of {len(plan)} runs already done; {len(todo)} to go "
          f"(~{len(todo) * (args.budget_s + 25) / 3600:.1f} h)", flush=True)
    t0 = time.time()
    for i, p in enumerate(todo):
        r = one_run(*p, args)
        with runs_path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        print(f"[{i + 1}/{len(todo)}] {r['key']}: final {r['final_return']:8.1f}  auc "
              f"{r['auc'] if r['auc'] is None else round(r['auc'], 1)}  updates {r['updates']}  "
              f"staleness {r['staleness_mean']:.2f}  ({time.time() - t0:.0f} s)", flush=True)


def _turns(items: list[str], seed: int) -> list[str]:
    """``items`` rotated by the seed: each strategy goes first on some seed."""
    k = seed % len(items)
    return items[k:] + items[:k]


def tuned_alphas(runs: dict[str, dict], args: argparse.Namespace) -> dict[str, dict]:
    """Per env and strategy, the alpha0 whose tuning runs have the best mean AUC."""
    best: dict[str, dict] = {}
    for env_id in args.envs:
        best[env_id] = {}
        for strategy in args.strategies:
            scores = {}
            for a in args.alphas:
                aucs = [r["auc"] for r in runs.values() if r["phase"] == "tune"
                        and r["env_id"] == env_id and r["strategy"] == strategy
                        and r["alpha0"] == a and r["auc"] is not None]
                if len(aucs) == len(args.tune_seeds):
                    scores[a] = float(np.mean(aucs))
            if scores:
                best[env_id][strategy] = {"alpha0": max(scores, key=scores.__getitem__),
                                          "mean_auc_by_alpha0": scores}
    return best


# ---- tables ------------------------------------------------------------------------------------
def summarise(rows: list[dict], group: tuple[str, ...]) -> list[dict]:
    from stats import bootstrap_ci, welch

    out = []
    keys = sorted({tuple(r[g] for g in group) for r in rows}, key=str)
    for k in keys:
        mine = [r for r in rows if tuple(r[g] for g in group) == k]
        entry = dict(zip(group, k))
        entry["runs"] = len(mine)
        for metric in ("final_return", "auc"):
            v = [r[metric] for r in mine if r[metric] is not None]
            entry[metric] = {"mean": float(np.mean(v)), "ci95": bootstrap_ci(v),
                             "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0}
        for metric in ("updates", "env_steps", "staleness_mean", "step_per_gradient",
                       "actor_apply_share", "gradients_dropped"):
            v = [r[metric] for r in mine if r[metric] is not None]
            entry[metric] = float(np.mean(v)) if v else None
        entry["alpha0"] = mine[0]["alpha0"]
        out.append(entry)
    # Stellaris against each baseline, same env (and learners)
    for entry in out:
        if entry["strategy"] == "stellaris":
            continue
        same = {g: entry[g] for g in group if g != "strategy"}
        ours = [r for r in rows if r["strategy"] == "stellaris"
                and all(r[g] == v for g, v in same.items())]
        theirs = [r for r in rows if r["strategy"] == entry["strategy"]
                  and all(r[g] == v for g, v in same.items())]
        if len(ours) > 1 and len(theirs) > 1:
            entry["stellaris_vs"] = {m: welch([r[m] for r in ours], [r[m] for r in theirs])
                                     for m in ("final_return", "auc")}
    return out


def markdown(summary: list[dict], title: str) -> str:
    lines = [f"### {title}", "",
             "| env | learners | strategy | seeds | alpha0 | step/gradient | final greedy return "
             "[95% CI] | AUC [95% CI] | Stellaris vs this: Welch t (p), final; AUC | updates | "
             "mean staleness |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        f, a = s["final_return"], s["auc"]
        vs = s.get("stellaris_vs")
        diff = "—" if vs is None else (f"t={vs['final_return']['t']:.2f} "
                                       f"(p={vs['final_return']['p']:.2f}), "
                                       f"t={vs['auc']['t']:.2f} (p={vs['auc']['p']:.2f})")
        step = "—" if s["step_per_gradient"] is None else f"{s['step_per_gradient']:.2f}"
        lines.append(
            f"| {s['env_id']} | {s['learners']} | {s['strategy']} | {s['runs']} | "
            f"{s['alpha0']:g} | {step} | "
            f"{f['mean']:.0f} [{f['ci95'][0]:.0f}, {f['ci95'][1]:.0f}] | {a['mean']:.0f} "
            f"[{a['ci95'][0]:.0f}, {a['ci95'][1]:.0f}] | {diff} | {s['updates']:.0f} | "
            f"{s['staleness_mean']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, budget_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env_id"] for r in rows))
    if not envs:
        return
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4), squeeze=False)
    grid = np.linspace(0, budget_s, AUC_POINTS)
    for ax, env_id in zip(axes[0], envs):
        for strategy in dict.fromkeys(r["strategy"] for r in rows):
            curves = [np.interp(grid, *np.array(r["curve"], np.float64).T, left=np.nan)
                      for r in rows if r["env_id"] == env_id and r["strategy"] == strategy
                      and r["curve"]]
            if curves:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    ax.plot(grid, np.nanmean(curves, axis=0), label=strategy)
        ax.set_title(f"{env_id}: PPO, report seeds (mean)")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("recent training return")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_results(args: argparse.Namespace, runs: dict[str, dict]) -> None:
    out = Path(args.out)
    chosen = tuned_alphas(runs, args)
    report = [r for r in runs.values() if r["phase"] == "report"]
    sweep = [r for r in runs.values() if r["phase"] in ("report", "staleness")
             and r["learners"] in args.sweep]
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "phase"},
        "pipeline": str(PIPELINE.relative_to(ROOT)), "strategy_settings": STRATEGY_SETTINGS,
        "tuned_alpha0": chosen,
        "report": summarise(report, ("env_id", "learners", "strategy")),
        "staleness_sweep": summarise(sweep, ("env_id", "learners", "strategy")),
        "runs": sorted(runs.values(), key=lambda r: r["key"]),
    }
    md = [markdown(result["report"], f"Report seeds, {args.learners} learners"),
          "", markdown(result["staleness_sweep"], "Staleness sweep")]
    tune_lines = ["", "### Tuning (mean AUC per alpha0, tuning seeds)", "",
                  "| env | strategy | chosen alpha0 | mean AUC by alpha0 |", "|---|---|---|---|"]
    for env_id, per in chosen.items():
        for strategy, c in per.items():
            by = ", ".join(f"{a:g}: {v:.0f}" for a, v in c["mean_auc_by_alpha0"].items())
            tune_lines.append(f"| {env_id} | {strategy} | {c['alpha0']:g} | {by} |")
    text = "\n".join(md + tune_lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(text)
    plot(report, out.with_suffix(".png"), args.budget_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=("tune", "report", "staleness", "summary"))
    ap.add_argument("--envs", nargs="+", default=ENVS)
    ap.add_argument("--strategies", nargs="+", default=STRATEGIES)
    ap.add_argument("--alphas", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--tune-seeds", nargs="+", type=int, default=[1001, 1002])
    ap.add_argument("--seeds", type=int, default=8, help="report seeds 1..N")
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--sweep", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--budget-s", type=float, default=150.0, help="wall budget per run")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--out", default=str(HERE / "results" / "ablation"))
    args = ap.parse_args()
    unknown = set(args.strategies) - set(STRATEGY_SETTINGS)
    if unknown:
        ap.error(f"unknown strategies {sorted(unknown)}")
    runs_path = Path(args.out).with_suffix(".runs.jsonl")
    runs_path.parent.mkdir(parents=True, exist_ok=True)
    if args.phase == "tune":
        plan = [("tune", env_id, strategy, a, args.learners, seed)
                for env_id in args.envs for seed in args.tune_seeds
                for strategy in _turns(args.strategies, seed) for a in args.alphas]
        execute(plan, args, runs_path)
    elif args.phase in ("report", "staleness"):
        chosen = tuned_alphas(load_runs(runs_path), args)
        missing = [(e, s) for e in args.envs for s in args.strategies
                   if s not in chosen.get(e, {})]
        if missing:
            ap.error(f"no complete tuning for {missing}: run the tune phase first")
        learners = [args.learners] if args.phase == "report" else \
            [n for n in args.sweep if n != args.learners]
        phase = args.phase
        plan = [(phase, env_id, strategy, chosen[env_id][strategy]["alpha0"], n, seed)
                for env_id in args.envs for n in learners for seed in range(1, args.seeds + 1)
                for strategy in _turns(args.strategies, seed)]
        execute(plan, args, runs_path)
    write_results(args, load_runs(runs_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
