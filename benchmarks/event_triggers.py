"""TianJi's event-triggered pulls: what each trigger costs and buys, and whether acting on a
delayed copy of the parameters ("shadow parameters") helps.

A rollout slot asks the parameter actor for the policy only every ``rollout.pull_every``
rollouts (k), and takes new parameters only when the actor's version moved by
``rollout.pull_min_versions`` or more (m). With m > 1 the slot acts on a copy that lags the
learners' parameters by up to m - 1 versions and is refreshed in one piece: the notes' shadow
parameters, so this benchmark answers both questions. The triggers compared:

``every``     k = 1, m = 1 (the default: ask before every rollout, load whenever it moved)
``every-4``   k = 4
``every-16``  k = 16
``moved-4``   m = 4
``moved-16``  m = 16

Each on PPO (``pipelines/ppo_cartpole.yaml``) and double DQN (``pipelines/dqn_cartpole.yaml``)
as shipped (their settings were tuned on seeds 101+, none of the seeds here), CartPole-v1, a
fixed budget of env steps (``--steps``), ``stop.solve_on_target=false`` (every run uses the
whole budget), a greedy evaluation of ``stop.eval_episodes`` (10) every ``--eval-every``
updates. Only the trigger differs between the sides of a comparison; every run is
``dask-rl train`` in a fresh process on its own embedded 2-worker cluster, triggers taking
turns within each seed.

Per run:

* **cost**: the slots' pulls asked of the actor per rollout, the pulls answered with
  parameters (loads) per rollout, and the parameter bytes handed to rollouts per 1,000 env
  steps (``summary.json``: ``rollout_pulls``, ``rollout_loads``, ``trajectories_produced``
  and ``cancelled_rollouts``; a slot on the actor's own worker is handed them in-process, so
  the bytes overstate the network's share);
* **throughput**: env steps per second of the run (``steps_per_s``);
* **staleness**: PPO's mean policy lag of the trajectories learned (learner version pulled
  minus the version that collected it);
* **learning**: the final greedy return and the area under the curve (the mean of the greedy
  evaluations over the run: higher means better sooner).

Each trigger against ``every`` as a difference of means with its Welch 95% interval over the
seeds (``stats.welch``).

    python benchmarks/event_triggers.py --algos ppo --seeds 8
    python benchmarks/event_triggers.py --algos dqn --seeds 5

Writes ``benchmarks/results/event_triggers.{json,md}`` (``--out``): every run's effective
config and figures, the tables. Runs already in the results JSON (same algo, trigger, seed and
budget) are not redone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # this checkout's dask_rl, whatever is installed

from stats import mean_ci, welch  # noqa: E402
from train_cli import train_command  # noqa: E402

PIPELINES = {"ppo": ROOT / "pipelines" / "ppo_cartpole.yaml",
             "dqn": ROOT / "pipelines" / "dqn_cartpole.yaml"}
TRIGGERS = {"every": (1, 1), "every-4": (4, 1), "every-16": (16, 1), "moved-4": (1, 4),
            "moved-16": (1, 16)}  # name -> (pull_every, pull_min_versions)
STEPS = {"ppo": 50_000, "dqn": 50_000}


def param_bytes(algo: str) -> int:
    from dask_rl.api import resolve
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model

    cfg = resolve(PIPELINES[algo], [])
    return int(get_flat(make_model(*env_spaces(cfg.env), cfg.model, seed=0)).nbytes)


def train(algo: str, trigger: str, seed: int, steps: int, eval_every: int) -> dict:
    every, moved = TRIGGERS[trigger]
    settings = ["cluster.dashboard=false", f"seed={seed}", f"stop.env_steps={steps}",
                "stop.solve_on_target=false", f"stop.eval_every_updates={eval_every}",
                f"rollout.pull_every={every}", f"rollout.pull_min_versions={moved}"]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = train_command(PIPELINES[algo], run, settings)
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.time() - t0
        if proc.returncode != 0:
            return {"algo": algo, "trigger": trigger, "seed": seed, "steps": steps,
                    "error": proc.stderr[-2000:], "wall_s": wall}
        summary = json.loads((run / "summary.json").read_text())
        records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    config = next(r["config"] for r in records if r["kind"] == "run")
    evals = [r["mean_return"] for r in records
             if r["kind"] == "eval" and r.get("purpose") == "screening"]
    lags = [r["policy_lag"] for r in records if r["kind"] == "learner"]
    rollouts = summary["trajectories_produced"] + summary["cancelled_rollouts"]
    return {"algo": algo, "trigger": trigger, "seed": seed, "steps": steps,
            "eval_every": eval_every, "pull_every": every, "pull_min_versions": moved,
            "wall_s": wall,
            "env_steps": summary["env_steps"], "steps_per_s": summary["steps_per_s"],
            "rollouts": rollouts, "rollout_pulls": summary["rollout_pulls"],
            "rollout_loads": summary["rollout_loads"],
            "pulls_per_rollout": summary["rollout_pulls"] / max(rollouts, 1),
            "loads_per_rollout": summary["rollout_loads"] / max(rollouts, 1),
            "policy_lag_mean": float(np.mean(lags)) if algo == "ppo" and lags else None,
            "final_return": summary["final_return"],
            "auc": float(np.mean(evals)) if evals else None, "evaluations": evals,
            "updates": summary["updates"], "config": config}


def table(runs: list[dict], algo: str, nbytes: int) -> tuple[list[dict], list[str]]:
    rows, lines = [], [
        "| trigger (k, m) | seeds | pulls / rollout | loads / rollout | KB to rollouts / 1k "
        "steps | env steps/s | policy lag | final return | AUC | final vs every (95% CI, p) "
        "| AUC vs every (95% CI, p) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = [r for r in runs if r["algo"] == algo and r["trigger"] == "every"]
    for trigger, (k, m) in TRIGGERS.items():
        mine = [r for r in runs if r["algo"] == algo and r["trigger"] == trigger]
        if not mine:
            continue

        def ci(key, rs=mine):
            values = [r[key] for r in rs if r[key] is not None]
            return mean_ci(values) if values else (float("nan"),) * 3

        kb = [r["rollout_loads"] * nbytes / 1e3 / (r["env_steps"] / 1e3) for r in mine]
        row = {"trigger": trigger, "pull_every": k, "pull_min_versions": m, "seeds": len(mine),
               "pulls_per_rollout": ci("pulls_per_rollout"),
               "loads_per_rollout": ci("loads_per_rollout"), "kb_per_1k_steps": mean_ci(kb),
               "steps_per_s": ci("steps_per_s"), "policy_lag": ci("policy_lag_mean"),
               "final_return": ci("final_return"), "auc": ci("auc")}
        vs = {}
        if trigger != "every" and len(base) >= 2 and len(mine) >= 2:
            for key in ("final_return", "auc"):
                a, b = [r[key] for r in mine], [r[key] for r in base]
                # no spread on either side (every seed at the cap): the difference alone
                vs[key] = welch(a, b) if np.var(a) + np.var(b) > 0 else \
                    {"diff": float(np.mean(a) - np.mean(b)), "ci95": None, "p": None}
        row["vs_every"] = vs
        rows.append(row)

        def cell(x, fmt="{:.2f}"):
            mean, lo, hi = x
            if np.isnan(mean):
                return "—"
            return fmt.format(mean) + ("" if np.isnan(lo) else
                                       " [" + fmt.format(lo) + ", " + fmt.format(hi) + "]")

        def diff(key):
            w = vs.get(key)
            if not w:
                return "—"
            if w["p"] is None:
                return f"{w['diff']:+.0f}"
            lo, hi = w["ci95"]
            return f"{w['diff']:+.0f} [{lo:+.0f}, {hi:+.0f}], p {w['p']:.2f}"

        lines.append(
            f"| {trigger} ({k}, {m}) | {len(mine)} | {cell(row['pulls_per_rollout'])} | "
            f"{cell(row['loads_per_rollout'])} | {cell(row['kb_per_1k_steps'], '{:.0f}')} | "
            f"{cell(row['steps_per_s'], '{:.0f}')} | {cell(row['policy_lag'])} | "
            f"{cell(row['final_return'], '{:.0f}')} | {cell(row['auc'], '{:.0f}')} | "
            f"{diff('final_return')} | {diff('auc')} |")
    return rows, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", nargs="+", choices=list(PIPELINES), default=list(PIPELINES))
    ap.add_argument("--triggers", nargs="+", choices=list(TRIGGERS), default=list(TRIGGERS))
    ap.add_argument("--seeds", type=int, default=5, help="seeds 1..N")
    ap.add_argument("--steps", type=int, help=f"env steps per run (default {STEPS})")
    ap.add_argument("--eval-every", type=int, default=10, help="updates between evaluations")
    ap.add_argument("--out", default=str(HERE / "results" / "event_triggers"))
    args = ap.parse_args()
    out = Path(args.out)
    done: list[dict] = []
    if out.with_suffix(".json").exists():
        done = json.loads(out.with_suffix(".json").read_text())["runs"]
    runs = [r for r in done if "error" not in r]
    for algo in args.algos:
        steps = args.steps or STEPS[algo]
        for seed in range(1, args.seeds + 1):
            for trigger in args.triggers:  # triggers take turns within a seed
                if any(r["algo"] == algo and r["trigger"] == trigger and r["seed"] == seed
                       and r["steps"] == steps and r["eval_every"] == args.eval_every
                       for r in runs):
                    continue
                r = train(algo, trigger, seed, steps, args.eval_every)
                print(f"{algo} {trigger:9s} seed {seed}: " + (
                    "ERROR " + r["error"].strip().splitlines()[-1] if "error" in r else
                    f"pulls/rollout {r['pulls_per_rollout']:.2f} loads/rollout "
                    f"{r['loads_per_rollout']:.2f} steps/s {r['steps_per_s']:.0f} final "
                    f"{r['final_return']:.0f} auc {r['auc']} ({r['wall_s']:.0f} s)"),
                    flush=True)
                if "error" in r:
                    continue
                runs.append(r)
                _write(out, runs, args)
    _write(out, runs, args)
    print(out.with_suffix(".md").read_text())
    return 0


def _write(out: Path, runs: list[dict], args: argparse.Namespace) -> None:
    tables, lines = {}, [
        "Event-triggered pulls (`python benchmarks/event_triggers.py`): k = "
        "`rollout.pull_every`, m = `rollout.pull_min_versions`; means with t 95% intervals "
        "over seeds; the last two columns are the trigger minus `every` (Welch).", ""]
    for algo in dict.fromkeys(r["algo"] for r in runs):
        nbytes = param_bytes(algo)
        rows, md = table(runs, algo, nbytes)
        steps = sorted({r["steps"] for r in runs if r["algo"] == algo})
        tables[algo] = {"param_bytes": nbytes, "rows": rows}
        lines += [f"### {algo.upper()} on CartPole-v1 ({', '.join(f'{s:,}' for s in steps)} env "
                  f"steps, {nbytes:,} parameter bytes)", "", *md, ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"benchmark": "event_triggers", "settings": vars(args), "triggers": TRIGGERS,
         "pipelines": {k: str(v.relative_to(ROOT)) for k, v in PIPELINES.items()},
         "tables": tables, "runs": runs}, indent=1, default=str))
    from stats import record_commit
    record_commit(out.with_suffix(".json"))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
