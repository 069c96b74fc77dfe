"""Learning at two commits, side by side: a refactor of the runtime should change no learning.

Each commit is checked out in its own detached worktree and every run is a fresh
``python -m dask_rl.cli train PIPELINE --run-dir RUN --no-progress --set ...`` process with
``PYTHONPATH`` set to that worktree (it comes before the editable install of the venv, so the
commit's own code runs, its cluster's workers included). Four workloads, as shipped in
``pipelines/`` at each commit:

* ``main``: ``ppo_cartpole.yaml``, 100k env steps;
* ``dqn``: ``dqn_cartpole.yaml``, 60k env steps;
* ``es``: ``es_cartpole.yaml``, 300k env steps;
* ``pbt``: ``pbt_cartpole.yaml``, 60k env steps per member (``stop.env_steps`` is per member).

Per run: the training process's wall seconds (``wall_s``) and its seconds to its last training
record (``train_s``: the end's final evaluation and confirmation left out, since the
confirmation rule made a confirmation 3x longer between the commits), its ``summary.json``, its
effective config (the ``run`` start record of ``metrics.jsonl``; for PBT the members' and the
population checkpoint's), the AUC (the mean of the screening evaluations' ``mean_return`` over
the run; for PBT over all members' ``members/m*/metrics.jsonl``) and the final policy's greedy
return on 100 fresh episodes (``dask-rl evaluate RUN --episodes 100 --seed 900000``; for PBT
the best member's run; for ES the same noiseless evaluation ES trains with,
``ESEvaluator.noiseless``, since ``dask-rl evaluate`` cannot play an ES checkpoint at either
commit), played by that side's own code. The sides alternate within each seed (old first on the
first seed, new first on the second, ...) so that machine noise falls on both.

``stop.solve_on_target=false`` on every run: the two commits differ in the confirmation rule
(what "solved" means), which would change when a run stops and so its budget; a fixed budget
of env steps isolates the runtime, which is what is compared.

    python benchmarks/runtime_parity.py --old c4a3d7e --new HEAD --seeds 301-305 \\
        --workloads main dqn es pbt
    python benchmarks/runtime_parity.py --old c4a3d7e --new HEAD --smoke   # 1 seed, budgets / 10

Writes ``benchmarks/results/runtime_parity.json`` (rewritten after every run, so a long run
that dies keeps its rows): both commits, the budgets and overrides, every run, and per workload
and metric (``final_eval_100``, ``auc``, ``train_s``, ``wall_s``) each side's mean with its t
95% CI, whether the new mean lies inside the old CI, and Welch's test of old - new; then
prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from stats import mean_ci, welch  # noqa: E402
from train_cli import train_command  # noqa: E402

PIPELINES = {"main": "pipelines/ppo_cartpole.yaml", "dqn": "pipelines/dqn_cartpole.yaml",
             "es": "pipelines/es_cartpole.yaml", "pbt": "pipelines/pbt_cartpole.yaml"}
BUDGETS = {"main": 100_000, "dqn": 60_000, "es": 300_000, "pbt": 60_000}  # pbt: per member
# every run, besides its seed and budget: no early stop, no dashboard port to fight over
OVERRIDES = ["stop.solve_on_target=false", "cluster.dashboard=false"]
EVAL_EPISODES, EVAL_SEED = 100, 900_000
METRICS = ("final_eval_100", "auc", "train_s", "wall_s")
# the records whose wall_s marks training (not the end's evaluations): a learner's result, an
# ES generation
TRAINING_KINDS = ("learner", "generation")

# run inside one worktree's checkout: ES's own greedy evaluation (the mean parameters, no
# noise) of a run's newest good checkpoint, printed as `dask-rl evaluate` prints its result
ES_EVAL = r"""
import json, sys
from pathlib import Path
from dask_rl.checkpoint import CheckpointStore
from dask_rl.data import PolicySnapshot
from dask_rl.policy import checkpoint_config, find_store
from dask_rl.roles.es_evaluator import ESEvaluator
store_dir, name = find_store(Path(sys.argv[1]))
store = CheckpointStore(store_dir)
if name is None:
    state, meta, name = store.load_latest_good()
else:
    state, meta = store.load(name)
cfg = checkpoint_config(meta)
actor = state["actor"]
evaluator = ESEvaluator(cfg, None)   # the noise table is only for perturbed episodes
evaluator.load(PolicySnapshot(int(actor["version"]), actor["params"], actor.get("moments")))
result = evaluator.noiseless(int(sys.argv[2]), int(sys.argv[3])).record()
result.update({"checkpoint": name, "env_id": cfg.env.name, "algorithm": cfg.algo.name,
               "env_steps": meta.get("env_steps")})
print(json.dumps(result, indent=2))
"""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _seeds(tokens: list[str]) -> list[int]:
    """``301-305``, ``301,303`` or ``301 302``."""
    out: list[int] = []
    for tok in (t for token in tokens for t in token.split(",") if t):
        lo, _, hi = tok.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    if not out:
        raise SystemExit("--seeds: no seed given")
    return out


def _env(tree: Path) -> dict[str, str]:
    # the worktree alone on the path: neither /work/main's editable install nor a caller's
    # PYTHONPATH may supply dask_rl
    return {**os.environ, "PYTHONPATH": str(tree)}


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.open() if line.strip()]


def _start_config(records: list[dict]) -> dict | None:
    return next((r.get("config") for r in records
                 if r.get("kind") == "run" and r.get("event") == "start"), None)


def _screening(records: list[dict]) -> list[float]:
    return [float(r["mean_return"]) for r in records
            if r.get("kind") == "eval" and r.get("purpose") == "screening"]


def _last_json(text: str) -> dict:
    """The JSON object a command printed (log lines before it are skipped)."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in the output: {text[-500:]!r}")
    return json.JSONDecoder().raw_decode(text[start:])[0]


def _population_config(run_dir: Path) -> dict | None:
    """PBT keeps its own (population) config only in its checkpoints' metadata."""
    ckpts = run_dir / "checkpoints"
    try:
        name = (ckpts / "latest").read_text().strip()
        meta = json.loads((ckpts / name / "zarr.json").read_text())["attributes"]["meta"]
        meta = json.loads(meta) if isinstance(meta, str) else meta
        return meta.get("config")
    except (OSError, KeyError, ValueError, AttributeError):
        return None


def _train_s(records: list[dict]) -> float | None:
    """The run's seconds to its last training record: its training without the end's final
    evaluation and confirmation (whose length is the confirmation rule's, not the runtime's)."""
    times = [float(r["wall_s"]) for r in records
             if r.get("kind") in TRAINING_KINDS and r.get("wall_s") is not None]
    return max(times) if times else None


def _read_run(workload: str, run_dir: Path, summary: dict) -> dict[str, Any]:
    """Effective config, screening evaluations, training seconds and the directory whose policy
    is evaluated."""
    if workload != "pbt":
        records = _records(run_dir / "metrics.jsonl")
        evals = _screening(records)
        return {"config": _start_config(records), "screening_returns": evals,
                "train_s": _train_s(records), "eval_dir": run_dir}
    members = sorted((run_dir / "members").glob("m*"), key=lambda p: int(p.name[1:]))
    member_records = {m.name: _records(m / "metrics.jsonl") for m in members}
    evals = {name: _screening(recs) for name, recs in member_records.items()}
    best = summary.get("best_member")
    listed = {m.get("member"): m.get("run_dir") for m in summary.get("members", [])}
    best_dir = Path(listed.get(best) or run_dir / "members" / f"m{best}")
    # the population's own greedy scores at each member's ready points (the exploit rule's)
    ready = [float(r["score"]) for r in _records(run_dir / "metrics.jsonl")
             if r.get("kind") == "lineage" and r.get("event") == "ready"
             and r.get("score") is not None]
    return {"config": {"population": _population_config(run_dir),
                       "members": {n: _start_config(r) for n, r in member_records.items()}},
            "screening_returns": [x for name in evals for x in evals[name]],
            "screening_returns_by_member": evals, "ready_scores": ready,
            "train_s": max((t for t in map(_train_s, member_records.values()) if t is not None),
                           default=None),
            "best_member": best, "eval_dir": best_dir}


def _evaluate(workload: str, tree: Path, run_dir: Path) -> tuple[dict, str, float]:
    if workload == "es":
        cmd = [sys.executable, "-c", ES_EVAL, str(run_dir), str(EVAL_EPISODES), str(EVAL_SEED)]
        how = "ESEvaluator.noiseless (ES's own greedy evaluation)"
    else:
        cmd = [sys.executable, "-m", "dask_rl.cli", "evaluate", str(run_dir),
               "--episodes", str(EVAL_EPISODES), "--seed", str(EVAL_SEED)]
        how = "dask-rl evaluate"
    t0 = time.perf_counter()
    # one torch thread, as on the workers (the old side's evaluate does not set it, and on a
    # busy machine thread contention made it 10x slower; the result does not depend on it)
    proc = subprocess.run(cmd, cwd=tree, env={**_env(tree), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"evaluation failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return _last_json(proc.stdout), how, wall


def run_one(side: str, sha: str, tree: Path, workload: str, seed: int, budget: int,
            runs_root: Path, extra: list[str]) -> dict[str, Any]:
    run_dir = runs_root / f"{workload}-s{seed}-{side}"
    settings = [*OVERRIDES, *extra, f"stop.env_steps={budget}", f"seed={seed}"]
    cmd = train_command(Path(PIPELINES[workload]), run_dir, settings)
    row: dict[str, Any] = {"side": side, "commit": sha, "workload": workload, "seed": seed,
                           "settings": settings, "run_dir": str(run_dir)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True)
    row["wall_s"] = time.perf_counter() - t0
    (runs_root / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not (run_dir / "summary.json").exists():
        row["error"] = f"train exited {proc.returncode}: {proc.stderr[-2000:]}"
        return row
    summary = json.loads((run_dir / "summary.json").read_text())
    read = _read_run(workload, run_dir, summary)
    evals = read.pop("screening_returns")
    row.update(summary=summary, **{k: v for k, v in read.items() if k != "eval_dir"},
               screening_returns=evals,
               auc=float(np.mean(evals)) if evals else None, n_screening=len(evals))
    row["eval_dir"] = str(read["eval_dir"])
    try:
        result, how, eval_wall = _evaluate(workload, tree, read["eval_dir"])
    except (RuntimeError, ValueError) as e:
        row["error"] = str(e)
        return row
    row.update(final_eval_100=float(result["mean_return"]), final_eval=result,
               eval_method=how, eval_wall_s=eval_wall)
    return row


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _clean(obj: Any) -> Any:
    """nan and inf as null: the file stays strict JSON."""
    if isinstance(obj, float):
        return _num(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def figures(runs: list[dict], workloads: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for w in workloads:
        out[w] = {}
        for metric in METRICS:
            values = {side: [r[metric] for r in runs if r["workload"] == w
                             and r["side"] == side and r.get(metric) is not None]
                      for side in ("old", "new")}
            entry: dict[str, Any] = {}
            for side, xs in values.items():
                if xs:
                    m, lo, hi = mean_ci(xs)
                    entry[side] = {"mean": m, "ci95": [lo, hi], "n": len(xs), "values": xs}
                else:
                    entry[side] = {"mean": None, "ci95": [None, None], "n": 0, "values": []}
            lo, hi = entry["old"]["ci95"]
            new = entry["new"]["mean"]
            entry["new_mean_inside_old_ci"] = (None if new is None or lo is None
                                               or not math.isfinite(lo)
                                               else bool(lo <= new <= hi))
            if min(len(values["old"]), len(values["new"])) >= 2:
                with np.errstate(divide="ignore", invalid="ignore"):
                    entry["welch"] = welch(values["old"], values["new"])
            else:
                entry["welch"] = None   # one seed a side: no spread to test against
            out[w][metric] = entry
    return out


def config_differences(runs: list[dict]) -> dict[str, list[str]]:
    """Key paths whose effective values differ between the sides' runs of one workload and
    seed (a field only one commit's schema has shows up too)."""
    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        return {k: v for key, val in d.items()
                for k, v in flat(val, f"{prefix}.{key}" if prefix else str(key)).items()}

    diffs: dict[str, set[str]] = {}
    pairs: dict[tuple[str, int], dict[str, dict]] = {}
    for r in runs:
        if r.get("config") is not None:
            pairs.setdefault((r["workload"], r["seed"]), {})[r["side"]] = r["config"]
    for (w, _), sides in pairs.items():
        if len(sides) == 2:
            a, b = flat(sides["old"]), flat(sides["new"])
            diffs.setdefault(w, set()).update(k for k in a.keys() | b.keys()
                                              if a.get(k, "<absent>") != b.get(k, "<absent>"))
    return {w: sorted(d) for w, d in diffs.items()}


def _fmt(entry: dict, digits: int) -> str:
    m, (lo, hi) = entry["mean"], entry["ci95"]
    if m is None:
        return "-"
    if lo is None or not math.isfinite(lo):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(result: dict) -> str:
    old, new = result["commits"]["old"][:9], result["commits"]["new"][:9]
    lines = [f"{'workload':9s} {'metric':15s} {'old ' + old:>24s} {'new ' + new:>24s} "
             f"{'old - new [95% CI]':>26s} {'p':>6s}  new in old CI"]
    for w, metrics in result["figures"].items():
        for metric, e in metrics.items():
            d = 0 if metric == "wall_s" else 1
            wt = e["welch"]
            diff = (f"{wt['diff']:+.{d}f} [{wt['ci95'][0]:+.{d}f}, {wt['ci95'][1]:+.{d}f}]"
                    if wt and wt["ci95"][0] is not None and math.isfinite(wt["ci95"][0])
                    else "-")
            p = f"{wt['p']:.3f}" if wt and wt["p"] is not None and math.isfinite(wt["p"]) else "-"
            inside = e["new_mean_inside_old_ci"]
            lines.append(f"{w:9s} {metric:15s} {_fmt(e['old'], d):>24s} {_fmt(e['new'], d):>24s} "
                         f"{diff:>26s} {p:>6s}  {'-' if inside is None else inside}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="c4a3d7e", help="the commit before the refactor")
    ap.add_argument("--new", default="HEAD", help="the commit after it")
    ap.add_argument("--seeds", nargs="+", default=["301-305"],
                    help="e.g. 301-305, 301,303 or 301 302")
    ap.add_argument("--workloads", nargs="+", choices=list(PIPELINES), default=list(PIPELINES))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "runtime_parity.json")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides for every run of both sides, e.g. "
                         "stop.confirm_episodes=100: where the commits' defaults differ")
    ap.add_argument("--smoke", action="store_true",
                    help="check the script: the first seed only, budgets / 10")
    ap.add_argument("--keep-runs", type=Path, default=None,
                    help="keep the run directories and logs here (default: deleted)")
    args = ap.parse_args()

    seeds = _seeds(args.seeds)[:1] if args.smoke else _seeds(args.seeds)
    budgets = {w: BUDGETS[w] // 10 if args.smoke else BUDGETS[w] for w in args.workloads}
    commits = {"old": _git("rev-parse", args.old), "new": _git("rev-parse", args.new)}
    import torch

    result: dict[str, Any] = {
        "what": "learning figures of two commits, fresh CLI processes per run, fixed env-step "
                "budgets, no early stop; final_eval_100: greedy mean return on 100 fresh "
                f"episodes (seed {EVAL_SEED}); auc: mean screening-evaluation return over "
                "the run; train_s: seconds to the last training record (a learner's result, "
                "an ES generation), i.e. without the end's evaluations; wall_s: the training "
                "process's seconds",
        "commit": _git("rev-parse", "HEAD"), "commits": commits, "smoke": args.smoke,
        "config": {"seeds": seeds, "budgets": budgets, "budget_unit": {
                       w: "env steps per member" if w == "pbt" else "env steps"
                       for w in args.workloads},
                   "overrides": [*OVERRIDES, *args.set],
                   "pipelines": {w: PIPELINES[w] for w in args.workloads},
                   "pipeline_blobs": {w: {side: _git("rev-parse", f"{sha}:{PIPELINES[w]}")
                                          for side, sha in commits.items()}
                                      for w in args.workloads},
                   "eval": {"episodes": EVAL_EPISODES, "seed": EVAL_SEED}},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "runs": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["figures"] = figures(result["runs"], args.workloads)
        result["config_differences"] = config_differences(result["runs"])
        args.out.write_text(json.dumps(_clean(result), indent=2) + "\n")

    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="runtime_parity-"))
    runs_root = args.keep_runs or tmp / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    trees: dict[str, Path] = {}
    try:
        for side, sha in commits.items():
            trees[side] = tmp / f"{side}-{sha[:12]}"
            _git("worktree", "add", "--detach", str(trees[side]), sha)
        for i, seed in enumerate(seeds):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for w in args.workloads:
                for side in order:
                    row = run_one(side, commits[side], trees[side], w, seed, budgets[w],
                                  runs_root, args.set)
                    row["order"] = len(result["runs"])
                    result["runs"].append(row)
                    save()
                    print(f"{w:5s} seed {seed} {side} {commits[side][:9]}: " + (
                        "ERROR " + row["error"].strip().splitlines()[-1] if "error" in row else
                        f"final_eval_100 {row['final_eval_100']:.1f}, auc "
                        f"{row['auc'] if row['auc'] is None else round(row['auc'], 1)} "
                        f"({row['n_screening']} evals), train {row['train_s']:.1f} s of "
                        f"{row['wall_s']:.0f} s, "
                        f"eval {row['eval_wall_s']:.0f} s"), flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    result["total_wall_s"] = time.perf_counter() - t_start
    save()
    print()
    print(table(_clean(result)))
    diffs = {w: d for w, d in result["config_differences"].items() if d}
    print(f"effective configs differ between the sides in: {diffs}" if diffs else
          "effective configs: identical between the sides for every workload and seed")
    errors = [r for r in result["runs"] if "error" in r]
    print(f"{len(result['runs'])} runs, {len(errors)} failed, "
          f"{result['total_wall_s'] / 60:.1f} min -> {args.out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
