"""Stellaris' ablation: the aggregation strategies on MuJoCo, at equal wall budgets.

Every run is PPO (``pipelines/ppo_hopper_stellaris.yaml``'s settings, the environment switched
by ``env.id``) on an embedded LocalCluster of 2 worker processes with 4 rollout slots, stopped
by wall time only (``stop.wall_s``, counted from when the run opens, after the cluster is up;
the final evaluation comes after it), then evaluated greedily on ``--eval-episodes`` episodes.
Only the aggregation strategy and its tuned ``alpha0`` differ between the sides of a
comparison, with one exception that has its own arm: Stellaris as specified turns on global IS
truncation (a change to the learner's loss, not to the aggregation), so ``stellaris-no-is``
runs the same aggregation without it. Strategies take turns within each seed so that machine
noise spreads over all of them. CartPole is left out of the ranking: every strategy reaches
its 500 cap there.

Three phases, each resumable (every finished run is appended to ``OUT.runs.jsonl`` at once,
keyed by phase, env, strategy, alpha0, learners, threads, seed and budget; a run already there
is not redone, so a long study can span several sessions):

``tune``
    For each strategy, ``alpha0`` from ``--alphas`` (0.125 to 4) on the tuning seeds
    (``--tune-seeds``, never reported) on one environment (``--tune-env``, Hopper-v5); the
    one with the best mean area under the curve wins and is used on every environment and
    learner count: one ``alpha0`` per strategy. ``stellaris-no-is`` takes Stellaris' choice
    (truncation changes the loss, not the server's step). A choice at either edge of the
    grid stops the later phases (``--allow-edge`` overrides): its best step may lie outside.
    Equal footing for the step: async, SSP and TianJi apply each gradient whole (TianJi's
    scaled by ``1 / (1 + lambda P)``); sync and softsync average what they buffer; Stellaris
    weighs each buffered gradient by its staleness and releases a fresh one alone at weight 1
    (the threshold floor). The same ``alpha0`` is thus a different step per gradient for
    each; tuning each over the grid gives each its best step, and the effective step per
    applied gradient (``alpha0`` times the mean weight, measured by the parameter actor:
    ``step_per_gradient``) is reported beside it.
``report``
    Each strategy at its tuned ``alpha0`` on the report seeds (1..``--seeds``, default 8,
    none used in tuning) on every ``--envs``, ``--learners`` concurrent learners (default 4).
``staleness``
    The same on the first of ``--envs`` at every learner count of ``--sweep`` (1, 2, 4, 8),
    seeds 1..``--sweep-seeds`` (default 4): how each strategy degrades as staleness grows,
    which is the paper's actual claim. Every row runs ``--sweep-threads`` threads per worker
    (default 4), so that the rows differ in the learner count alone; threads beyond the cores
    cost throughput, which every row then pays alike. The 4 rollout slots hold 4 of the 8
    threads, so at most 4 learners run at once: at 8 the rest queue, and a queued learner
    pulls when it starts, so the 8-learner row is no staler than the 4-learner one (8 in
    flight would take 6 threads per worker). The tune and report phases run ``--threads``
    (default 2), so the sweep's 4-learner row is its own runs, not the report's. On 2 cores
    more learners do not add compute: each runs slower and staler.

Figures: the final greedy return and the area under the curve (the mean over the budget, on
100 points of wall time, of the recent training return: higher means better sooner), each as
a mean with a t 95% interval; Stellaris minus each baseline as a difference of means with its
Welch interval and p, with Holm's adjustment over each table's family of tests; and, for the
sweep, each strategy's drop from the fewest learners to each other count, with the difference
between Stellaris' drop and each baseline's (bootstrap intervals). Each run keeps the strategy's
counters at its end (``diagnostics``: threshold releases, SSP's refused reads, TianJi's P,
truncated samples) and the commit it ran.

    python benchmarks/ablation.py tune
    python benchmarks/ablation.py report
    python benchmarks/ablation.py staleness
    python benchmarks/ablation.py summary        # tables and plot from what has run

Writes ``benchmarks/results/ablation.json`` (the settings, the tuning choice, the tables; every
run's effective config stays in ``ablation.runs.jsonl`` alone) and ``ablation.{md,png}``.
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
STRATEGIES = ["stellaris", "stellaris-no-is", "tianji", "async", "ssp", "softsync", "sync"]
STRATEGY_SETTINGS = {
    # the paper's method as specified: decay 0.96, v = 3, global IS truncation (rho = 1),
    # with the threshold floor of 1 (docs/benchmarks.md, "the threshold floor")
    "stellaris": ["aggregation.strategy=stellaris", "learner.is_truncation=true"],
    # its aggregation alone: IS truncation changes the learner's loss, not the aggregation,
    # and no other arm has it; this arm separates the two
    "stellaris-no-is": ["aggregation.strategy=stellaris", "learner.is_truncation=false"],
    "stellaris-auto": ["aggregation.strategy=stellaris", "aggregation.decay=auto",
                       "learner.is_truncation=true"],
    # TianJi's step alpha0 / (1 + lambda P), P the share of stale samples (lambda 1); the
    # recorded rows ran the strict P (any lag stale), since made the option lag_tolerance=0
    "tianji": ["aggregation.strategy=tianji", "aggregation.lag_tolerance=0",
               "learner.is_truncation=false"],
    "async": ["aggregation.strategy=async", "learner.is_truncation=false"],
    "ssp": ["aggregation.strategy=ssp", "aggregation.bound=3", "learner.is_truncation=false"],
    "softsync": ["aggregation.strategy=softsync", "aggregation.n=2",
                 "learner.is_truncation=false"],
    "sync": ["aggregation.strategy=sync", "learner.is_truncation=false"],
}
# an arm that takes another arm's tuned alpha0 instead of a tuning of its own (truncation
# changes the loss, not the server's step)
TUNED_WITH = {"stellaris-no-is": "stellaris"}
# rollout slots fixed for every run: by default they follow the worker threads, which the
# 8-learner rows raise (more samplers, not only more learners)
SLOTS = 4
AUC_POINTS = 100


def run_key(phase: str, env_id: str, strategy: str, alpha0: float, learners: int,
            threads: int, seed: int, budget_s: float) -> str:
    return (f"{phase}/{env_id}/{strategy}/a{alpha0:g}/L{learners}/t{threads}/s{seed}"
            f"/b{budget_s:g}")


def one_run(phase: str, env_id: str, strategy: str, alpha0: float, learners: int,
            threads: int, seed: int, args: argparse.Namespace) -> dict:
    import dask_rl
    from dask_rl.data.metrics import read_metrics

    overrides = [f"env.id={env_id}", *STRATEGY_SETTINGS[strategy],
                 f"aggregation.alpha0={alpha0}", f"seed={seed}",
                 f"stop.wall_s={args.budget_s}", "stop.env_steps=1000000000",
                 "stop.solve_on_target=false", "stop.eval_every_updates=0",
                 # no target: every final evaluation is the same --eval-episodes, unconfirmed
                 "stop.target_return=1e9",
                 f"stop.eval_episodes={args.eval_episodes}", "checkpoint.every_s=0",
                 "cluster.n_workers=2", f"cluster.threads_per_worker={threads}",
                 "cluster.dashboard=false", f"learner.max_learners={learners}",
                 f"rollout.slots={SLOTS}"]
    with tempfile.TemporaryDirectory() as tmp:
        res = dask_rl.train(PIPELINE, run_dir=Path(tmp) / "run", overrides=overrides)
        records = read_metrics(Path(tmp) / "run" / "metrics.jsonl")
    s = res.summary
    config = next(r["config"] for r in records if r["kind"] == "run" and r["event"] == "start")
    # the strategy's own counters at the end (threshold releases, SSP's refused reads,
    # TianJi's P, truncated samples...): what explains a result
    last_round = next((r for r in reversed(records) if r["kind"] == "round"), {})
    curve = [(r["wall_s"], r["charts/return_recent"]) for r in records
             if r["kind"] == "learner" and r.get("charts/return_recent") is not None]
    return {"key": run_key(phase, env_id, strategy, alpha0, learners, threads, seed,
                           args.budget_s),
            "phase": phase, "env_id": env_id, "strategy": strategy, "alpha0": alpha0,
            "learners": learners, "threads": threads, "seed": seed, "budget_s": args.budget_s,
            "final_return": s["final_return"],
            "auc": auc(curve, args.budget_s), "updates": s["updates"],
            "env_steps": s["env_steps"], "staleness_mean": s["staleness_mean"],
            "staleness_max": s["staleness_max"], "gradients_applied": s["gradients_applied"],
            "gradients_dropped": s["gradients_dropped"],
            "step_per_gradient": s["step_per_gradient"],
            "actor_apply_share": s["actor_apply_share"], "wall_s": s["wall_s"],
            "diagnostics": last_round, "commit": _commit(), "config": config,
            "curve": [(round(t, 2), round(y, 1)) for t, y in curve]}


def _commit() -> str:
    import subprocess

    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True)
    return proc.stdout.strip() or "unknown"


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
    for r in runs:  # runs from before threads were a field: their effective config says
        r.setdefault("threads", r["config"]["cluster"]["threads_per_worker"])
        r["key"] = run_key(r["phase"], r["env_id"], r["strategy"], r["alpha0"], r["learners"],
                           r["threads"], r["seed"], r["budget_s"])
    return {r["key"]: r for r in runs}


def execute(plan: list[tuple], args: argparse.Namespace, runs_path: Path) -> None:
    done = load_runs(runs_path)
    todo = [p for p in plan if run_key(*p, args.budget_s) not in done]
    print(f"{len(plan) - len(todo)} of {len(plan)} runs already done; {len(todo)} to go "
          f"(~{len(todo) * (args.budget_s + 25) / 3600:.1f} h)", flush=True)
    t0 = time.time()
    for i, p in enumerate(todo):
        r = one_run(*p, args)
        if r["wall_s"] < 0.95 * args.budget_s:  # cut short (a worker killed, a stall)
            print(f"[{i + 1}/{len(todo)}] {r['key']}: stopped at {r['wall_s']:.0f} s of "
                  f"{args.budget_s:g}: not recorded", flush=True)
            continue
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
    """Per strategy, the alpha0 whose tuning runs (on ``--tune-env``, the tuning seeds, this
    budget and learner count) have the best mean AUC. Only a complete grid chooses; a winner
    at either edge of the grid is marked (its best step may lie outside it). An arm of
    :data:`TUNED_WITH` takes its partner's choice."""
    best: dict[str, dict] = {}
    for strategy in args.strategies:
        if strategy in TUNED_WITH:
            continue
        per_seed: dict[float, list[float]] = {}
        for a in args.alphas:
            per_seed[a] = [r["auc"] for r in runs.values() if r["phase"] == "tune"
                           and r["env_id"] == args.tune_env and r["strategy"] == strategy
                           and r["alpha0"] == a and r["seed"] in args.tune_seeds
                           and r["budget_s"] == args.budget_s
                           and r["learners"] == args.learners and r["threads"] == args.threads
                           and r["auc"] is not None]
        if all(len(v) == len(args.tune_seeds) for v in per_seed.values()):
            scores = {a: float(np.mean(v)) for a, v in per_seed.items()}
            choice = max(scores, key=scores.__getitem__)
            best[strategy] = {"alpha0": choice, "env_id": args.tune_env,
                              "mean_auc_by_alpha0": scores, "auc_by_alpha0": per_seed,
                              "at_grid_edge": choice in (min(args.alphas), max(args.alphas))}
    for arm, partner in TUNED_WITH.items():
        if arm in args.strategies and partner in best:
            best[arm] = {**best[partner], "tuned_with": partner}
    return best


# ---- tables ------------------------------------------------------------------------------------
REFERENCE = "stellaris"


def summarise(rows: list[dict], group: tuple[str, ...]) -> list[dict]:
    """Per group: final greedy return and AUC as means with t intervals (a percentile
    bootstrap over 8 seeds is too narrow), the other figures as means; and Stellaris against
    each baseline of the same group: the difference of means with its Welch interval, p and
    Holm's adjustment over the table's family of tests (both metrics, every group)."""
    from stats import holm, mean_ci, welch

    out = []
    keys = sorted({tuple(r[g] for g in group) for r in rows}, key=str)
    for k in keys:
        mine = [r for r in rows if tuple(r[g] for g in group) == k]
        entry = dict(zip(group, k))
        entry["runs"] = len(mine)
        entry["seeds"] = sorted(r["seed"] for r in mine)
        for metric in ("final_return", "auc"):
            v = [r[metric] for r in mine if r[metric] is not None]
            m, lo, hi = mean_ci(v)
            entry[metric] = {"mean": m, "ci95": [lo, hi],
                             "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
                             "values": v}
        for metric in ("updates", "gradients_applied", "env_steps", "staleness_mean",
                       "step_per_gradient", "actor_apply_share", "gradients_dropped"):
            v = [r[metric] for r in mine if r[metric] is not None]
            entry[metric] = float(np.mean(v)) if v else None
        entry["alpha0"] = sorted({r["alpha0"] for r in mine})
        out.append(entry)
    tests = []
    for entry in out:
        if entry["strategy"] == REFERENCE:
            continue
        same = {g: entry[g] for g in group if g != "strategy"}
        ours = [r for r in rows if r["strategy"] == REFERENCE
                and all(r[g] == v for g, v in same.items())]
        theirs = [r for r in rows if r["strategy"] == entry["strategy"]
                  and all(r[g] == v for g, v in same.items())]
        if len(ours) > 1 and len(theirs) > 1:
            entry["stellaris_vs"] = {m: welch([r[m] for r in ours], [r[m] for r in theirs])
                                     for m in ("final_return", "auc")}
            tests += [entry["stellaris_vs"]["final_return"], entry["stellaris_vs"]["auc"]]
    for test, adjusted in zip(tests, holm([t["p"] for t in tests]) if tests else []):
        test["p_holm"] = adjusted
    return out


def degradation(rows: list[dict], low: int, high: int) -> list[dict]:
    """Per env and strategy, how much the mean final return and AUC drop from ``low`` to
    ``high`` concurrent learners (Welch 95% interval, as every difference of means here), and
    whether Stellaris' drop is smaller than each baseline's (the difference of the two drops,
    bootstrap interval): the
    paper's claim is about degradation with staleness, which a test per row cannot show."""
    from stats import bootstrap_diff_of_diffs, welch

    out = []
    for env_id in sorted({r["env_id"] for r in rows}):
        def vals(strategy, n, metric):
            return [r[metric] for r in rows if r["env_id"] == env_id
                    and r["strategy"] == strategy and r["learners"] == n
                    and r[metric] is not None]
        for strategy in sorted({r["strategy"] for r in rows if r["env_id"] == env_id}):
            entry = {"env_id": env_id, "strategy": strategy, "from": low, "to": high}
            for metric in ("final_return", "auc"):
                a, b = vals(strategy, low, metric), vals(strategy, high, metric)
                if len(a) < 2 or len(b) < 2:
                    continue
                drop = welch(a, b)
                entry[metric] = {"drop": drop["diff"], "ci95": drop["ci95"]}
                if strategy != REFERENCE:
                    ra, rb = vals(REFERENCE, low, metric), vals(REFERENCE, high, metric)
                    if len(ra) > 1 and len(rb) > 1:
                        d, lo, hi = bootstrap_diff_of_diffs(ra, rb, a, b)
                        entry[metric]["stellaris_drop_minus_this"] = {"diff": d,
                                                                      "ci95": [lo, hi]}
            if "final_return" in entry or "auc" in entry:
                out.append(entry)
    return out


def _pvalue(x: float) -> str:
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def _p(test: dict) -> str:
    p, ph = test["p"], test.get("p_holm", test["p"])
    lo, hi = test["ci95"]
    return f"{test['diff']:+.0f} [{lo:+.0f}, {hi:+.0f}], p {_pvalue(p)} (Holm {_pvalue(ph)})"


def markdown(summary: list[dict], title: str) -> str:
    lines = [f"### {title}", "",
             "| env | learners | strategy | seeds | alpha0 | step/gradient | final greedy return "
             "[95% CI] | AUC [95% CI] | Stellaris minus this, final [95% CI], p | same, AUC | "
             "updates | mean staleness |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        f, a = s["final_return"], s["auc"]
        vs = s.get("stellaris_vs")
        step = "—" if s["step_per_gradient"] is None else f"{s['step_per_gradient']:.2f}"
        alphas = ", ".join(f"{x:g}" for x in s["alpha0"])
        lines.append(
            f"| {s['env_id']} | {s['learners']} | {s['strategy']} | {s['runs']} | {alphas} | "
            f"{step} | {f['mean']:.0f} [{f['ci95'][0]:.0f}, {f['ci95'][1]:.0f}] | "
            f"{a['mean']:.0f} [{a['ci95'][0]:.0f}, {a['ci95'][1]:.0f}] | "
            f"{'—' if vs is None else _p(vs['final_return'])} | "
            f"{'—' if vs is None else _p(vs['auc'])} | {s['updates']:.0f} | "
            f"{s['staleness_mean']:.2f} |")
    return "\n".join(lines)


def markdown_degradation(rows: list[dict]) -> str:
    lines = ["### Degradation with staleness (mean at the fewest learners minus mean at each "
             "other count)", "",
             "Negative \"Stellaris' drop minus this\": Stellaris degrades less than this "
             "strategy.", "",
             "| env | strategy | learners | final: drop [95% CI] | Stellaris' drop minus this "
             "[95% CI] | AUC: drop [95% CI] | Stellaris' drop minus this [95% CI] |",
             "|---|---|---|---|---|---|---|"]

    def cell(d):
        if d is None:
            return "—", "—"
        vs = d.get("stellaris_drop_minus_this")
        return (f"{d['drop']:.0f} [{d['ci95'][0]:.0f}, {d['ci95'][1]:.0f}]",
                "—" if vs is None else f"{vs['diff']:+.0f} [{vs['ci95'][0]:+.0f}, "
                                       f"{vs['ci95'][1]:+.0f}]")
    for r in rows:
        f, a = cell(r.get("final_return")), cell(r.get("auc"))
        lines.append(f"| {r['env_id']} | {r['strategy']} | {r['from']} -> {r['to']} | {f[0]} | "
                     f"{f[1]} | {a[0]} | {a[1]} |")
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

    def counted(r: dict, seeds: int) -> bool:  # this study's rows only: tuned step, budget
        c = chosen.get(r["strategy"])
        return (c is not None and r["alpha0"] == c["alpha0"] and r["budget_s"] == args.budget_s
                and 1 <= r["seed"] <= seeds and r["env_id"] in args.envs
                and r["strategy"] in args.strategies)

    report = [r for r in runs.values() if r["phase"] == "report"
              and r["learners"] == args.learners and r["threads"] == args.threads
              and counted(r, args.seeds)]
    sweep = [r for r in runs.values() if r["phase"] == "staleness"
             and r["threads"] == args.sweep_threads and r["env_id"] == args.envs[0]
             and r["learners"] in args.sweep and counted(r, args.sweep_seeds)]
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "phase"},
        "pipeline": str(PIPELINE.relative_to(ROOT)), "strategy_settings": STRATEGY_SETTINGS,
        "tuned_with": TUNED_WITH, "rollout_slots": SLOTS, "tuned_alpha0": chosen,
        "report": summarise(report, ("env_id", "learners", "strategy")),
        "staleness_sweep": summarise(sweep, ("env_id", "learners", "strategy")),
        # from the fewest learners to each other count: where the drop happens, not only
        # its size at the end
        "degradation": [d for n in sorted(args.sweep)[1:]
                        for d in degradation(sweep, min(args.sweep), n)],
        # every run, its effective config and commit: one copy, in the runs file
        "runs_file": out.with_suffix(".runs.jsonl").name, "runs": len(runs),
    }
    md = [markdown(result["report"], f"Report seeds 1-{args.seeds}, {args.learners} learners"),
          "", markdown(result["staleness_sweep"], f"Staleness sweep, seeds 1-{args.sweep_seeds}, "
                            f"{args.sweep_threads} threads per worker on every row"),
          "", markdown_degradation(result["degradation"])]
    tune_lines = ["", f"### Tuning on {args.tune_env} (AUC per alpha0: mean, then each tuning "
                  f"seed of {', '.join(map(str, args.tune_seeds))})", "",
                  "| strategy | chosen alpha0 | AUC by alpha0 |", "|---|---|---|"]
    for strategy, c in chosen.items():
        if "tuned_with" in c:
            tune_lines.append(f"| {strategy} | {c['alpha0']:g} | {c['tuned_with']}'s |")
            continue
        by = ", ".join(f"{a:g}: {c['mean_auc_by_alpha0'][a]:.0f} ("
                       + " / ".join(f"{v:.0f}" for v in c["auc_by_alpha0"][a]) + ")"
                       for a in c["mean_auc_by_alpha0"])
        edge = " (grid edge)" if c["at_grid_edge"] else ""
        tune_lines.append(f"| {strategy} | {c['alpha0']:g}{edge} | {by} |")
    text = "\n".join(md + tune_lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(text)
    if report:
        plot(report, out.with_suffix(".png"), args.budget_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=("tune", "report", "staleness", "summary"))
    ap.add_argument("--envs", nargs="+", default=ENVS)
    ap.add_argument("--strategies", nargs="+", default=STRATEGIES)
    ap.add_argument("--alphas", nargs="+", type=float,
                    default=[0.125, 0.25, 0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--tune-env", default="Hopper-v5", help="the environment alpha0 is tuned on")
    ap.add_argument("--tune-seeds", nargs="+", type=int, default=[1001, 1002])
    ap.add_argument("--seeds", type=int, default=8, help="report seeds 1..N")
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2,
                    help="threads per worker in the tune and report phases")
    ap.add_argument("--sweep-threads", type=int, default=4,
                    help="threads per worker on every row of the staleness sweep")
    ap.add_argument("--sweep", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--sweep-seeds", type=int, default=4, help="staleness sweep seeds 1..N")
    ap.add_argument("--allow-edge", action="store_true",
                    help="report with an alpha0 chosen at the edge of the grid")
    ap.add_argument("--budget-s", type=float, default=120.0, help="wall budget per run")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--out", default=str(HERE / "results" / "ablation"))
    args = ap.parse_args()
    unknown = set(args.strategies) - set(STRATEGY_SETTINGS)
    if unknown:
        ap.error(f"unknown strategies {sorted(unknown)}")
    runs_path = Path(args.out).with_suffix(".runs.jsonl")
    runs_path.parent.mkdir(parents=True, exist_ok=True)
    if args.phase == "tune":
        arms = [s for s in args.strategies if s not in TUNED_WITH]
        plan = [("tune", args.tune_env, strategy, a, args.learners, args.threads, seed)
                for seed in args.tune_seeds
                for strategy in _turns(arms, seed) for a in args.alphas]
        execute(plan, args, runs_path)
    elif args.phase in ("report", "staleness"):
        chosen = tuned_alphas(load_runs(runs_path), args)
        missing = [s for s in args.strategies if s not in chosen]
        if missing:
            ap.error(f"no complete tuning for {missing}: run the tune phase first")
        edge = [s for s in args.strategies if chosen[s]["at_grid_edge"]]
        if edge and not args.allow_edge:
            ap.error(f"alpha0 chosen at the grid's edge for {edge}: widen --alphas and tune "
                     "again (or --allow-edge)")
        phase = args.phase
        if phase == "report":
            plan = [(phase, env_id, strategy, chosen[strategy]["alpha0"], args.learners,
                     args.threads, seed)
                    for env_id in args.envs for seed in range(1, args.seeds + 1)
                    for strategy in _turns(args.strategies, seed)]
        else:  # seed by seed, so that a study cut short has whole seeds
            plan = [(phase, args.envs[0], strategy, chosen[strategy]["alpha0"], n,
                     args.sweep_threads, seed)
                    for seed in range(1, args.sweep_seeds + 1) for n in args.sweep
                    for strategy in _turns(args.strategies, seed)]
        execute(plan, args, runs_path)
    write_results(args, load_runs(runs_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
