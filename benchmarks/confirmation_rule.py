"""How often a confirmed "solved" fails a fresh evaluation by the standard, per confirmation rule.

A run stops at its first confirmation that passes, so what a user meets is the chance, per
attempt, that a confirmation passes *and* the policy then falls short of the target on a fresh
evaluation of the env's standard length (100 episodes for CartPole, Gym's definition). That
chance depends on the policy's return distribution, and a nearly solved CartPole policy's is
skewed: most episodes reach the 500-step cap, a fraction ``p`` fail earlier. Here the failures'
returns are uniform on ``[low, 490]``: ``low`` 50 (rare, deep failures) and 300 (shallow ones)
bracket what the main job's policies show (seed 12 of the suite's five-seed test: 489.4 +- 31.5
over 100 episodes, then 474.3 +- 47.3 over 100 fresh ones).

Rules compared (``m``: the margin):

``old``  100 episodes, ``mean - 4 * std / sqrt(100) >= 475`` (this project before 2026-12-03)
``new``  300 episodes, ``control.schedule.target_confirmed`` with margin 3.5 and the standard
         100: the bar is the gap to a fresh 100-episode evaluation's mean

Per (low, p): the true mean, the chance a fresh 100-episode evaluation fails, and per rule the
chance a confirmation passes and the joint chance (pass, then the fresh evaluation fails).

With ``--train-seeds``, also the real thing: the main job (``pipelines/ppo_cartpole.yaml``, as
shipped) trained on each seed on a 2-worker LocalCluster, and every policy it calls solved
evaluated again on ``--fresh`` independent evaluations of 100 fresh episodes (seeds no run
uses, 100 apart so that no two share an env), each counted as a failure below 475. The
suite's five-seed test uses seeds 11-15; these are others.

Writes ``benchmarks/results/confirmation_rule.json`` with its settings and commit.

    python benchmarks/confirmation_rule.py --draws 40000 --train-seeds 1-10 --fresh 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import numpy as np

from dask_rl.control.schedule import target_confirmed

TARGET, CAP, STANDARD = 475.0, 500.0, 100


def returns(rng: np.random.Generator, p: float, low: float, n: int, draws: int) -> np.ndarray:
    fail = rng.random((draws, n)) < p
    return np.where(fail, rng.uniform(low, 490.0, (draws, n)), CAP)


def old_rule(mean, std, n):
    return mean - 4.0 * std / np.sqrt(n) >= TARGET


def new_rule(mean, std, n):
    return np.array([target_confirmed(mean=m, std=s, episodes=n, target=TARGET, margin=3.5,
                                      standard_episodes=STANDARD) for m, s in zip(mean, std)])


def trained(seeds: list[int], fresh: int) -> list[dict]:
    """Each seed's main job, and its solved policy on ``fresh`` evaluations of 100 episodes."""
    import tempfile

    from distributed import Client, LocalCluster

    import dask_rl
    from dask_rl.checkpoint import CheckpointStore
    from dask_rl.config import load_pipeline
    from dask_rl.data import PolicySnapshot
    from dask_rl.roles.evaluation import evaluate

    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client, tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            run_dir = Path(tmp) / f"seed{seed}"
            s = dask_rl.train("pipelines/ppo_cartpole.yaml", client=client, run_dir=run_dir,
                              overrides=[f"seed={seed}"]).summary
            row = {"seed": seed, "solved": s["solved"], "env_steps": s["env_steps"],
                   "confirmation": s["confirmation"]}
            if s["solved"]:
                state, _ = CheckpointStore(run_dir / "checkpoints").load()
                actor = state["actor"]
                snap = PolicySnapshot(int(actor["version"]), actor["params"],
                                      actor.get("moments"))
                cfg = load_pipeline("pipelines/ppo_cartpole.yaml", [f"seed={seed}"])
                # an evaluation's envs are seeded seed, seed + 1, ... (16 of them): seeds 100
                # apart share no env
                again = [evaluate(cfg, snap, episodes=STANDARD,
                                  seed=555_000 + 1_000 * seed + 100 * k) for k in range(fresh)]
                row["fresh"] = [{"mean": e.mean_return, "std": e.std_return} for e in again]
                row["fresh_failed"] = sum(e.mean_return < TARGET for e in again)
            rows.append(row)
            print(f"seed {seed}: solved {s['solved']} at {s['env_steps']} steps, confirmation "
                  f"{(s['confirmation'] or {}).get('mean_return')}, fresh "
                  f"{[round(f['mean'], 1) for f in row.get('fresh', [])]}", flush=True)
    return rows


def seed_list(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-seeds", type=seed_list, default=[],
                    help="also train the main job on these seeds (e.g. 1-10)")
    ap.add_argument("--fresh", type=int, default=5,
                    help="fresh 100-episode evaluations of each solved policy")
    ap.add_argument("--out", default="benchmarks/results/confirmation_rule.json")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rules = {"old": (100, old_rule), "new": (300, new_rule)}
    rows = []
    for low in (50.0, 300.0):
        for p in (0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3):
            fresh = returns(rng, p, low, STANDARD, args.draws).mean(1)
            fail = float((fresh < TARGET).mean())
            row = {"low": low, "p": p, "true_mean": CAP - p * (CAP - (low + 490.0) / 2),
                   "fresh_fails": fail}
            for name, (n, rule) in rules.items():
                c = returns(rng, p, low, n, args.draws)
                passed = float(rule(c.mean(1), c.std(1, ddof=1), n).mean())
                row[name] = {"episodes": n, "passes": passed, "pass_then_fails": passed * fail}
            rows.append(row)
            print(f"low {low:>5.0f} p {p:.2f} mean {row['true_mean']:6.1f} fresh fails {fail:.4f}"
                  + "".join(f" | {k}: pass {row[k]['passes']:.4f} joint "
                            f"{row[k]['pass_then_fails']:.5f}" for k in rules))
    worst = {k: max(r[k]["pass_then_fails"] for r in rows) for k in rules}
    print("worst joint per attempt:", worst)
    runs = trained(args.train_seeds, args.fresh) if args.train_seeds else []
    solved = [r for r in runs if r["solved"]]
    fresh_failed = {"evaluations": sum(len(r["fresh"]) for r in solved),
                    "failed": sum(r["fresh_failed"] for r in solved)}
    if runs:
        print(f"trained: {len(solved)} of {len(runs)} solved; fresh evaluations failed "
              f"{fresh_failed['failed']} of {fresh_failed['evaluations']}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    Path(args.out).write_text(json.dumps({
        "commit": commit, "config": {"draws": args.draws, "seed": args.seed, "target": TARGET,
                                     "cap": CAP, "standard_episodes": STANDARD,
                                     "rules": {"old": "100 episodes, 4 standard errors",
                                               "new": "300 episodes, target_confirmed margin "
                                                      "3.5, standard 100"},
                                     "pipeline": "pipelines/ppo_cartpole.yaml"},
        "rows": rows, "worst_pass_then_fails": worst,
        "trained": {"seeds": args.train_seeds, "fresh_per_policy": args.fresh, "runs": runs,
                    "solved": len(solved), "fresh_failed": fresh_failed}}, indent=2))


if __name__ == "__main__":
    main()
