"""Double DQN on Atari Pong: does a short CPU run of ``pipelines/dqn_pong.yaml`` learn?

The claim under test (issue 18): a short run of the pipeline as shipped raises Pong's greedy
return above a uniformly random policy's. Both sides are judged the same way: full games of
the evaluation env (the pipeline's Atari preprocessing, no episodic life, the raw game score
from -21 to 21), on game seeds no training run uses, ``--games`` of them per side:

1. **random**: uniformly random actions;
2. **trained**: for each seed, ``dask-rl train pipelines/dqn_pong.yaml --set seed=S --set
   stop.env_steps=B`` in a fresh process on its own embedded 2-worker cluster; then the run's
   final checkpoint is loaded (``dask_rl.load_policy``) and plays its games greedily, apart
   from the run's own evaluations. The run's screening evaluations (every
   ``stop.eval_every_updates``) and its training episodes give the curve on the way.

Each trained run's games are compared with the random games by Welch's t-test (difference of
mean score, 95% interval, p); so is every trained game pooled. "Learns" means the pooled
interval lies above zero.

    python benchmarks/dqn_pong.py --env-steps 300000 --seeds 2 --keep RUNS

A run takes hours on a small CPU machine, so the study can be paused and continued: Ctrl-C
(SIGINT to the ``dask-rl train`` process) stops the run at a checkpoint, replay buffer
included, and the same command with the same ``--keep`` continues it with ``dask-rl train
--resume`` (a finished run is not redone). Without ``--keep`` the runs live in a temporary
directory and cannot be continued. Each run's record counts its resumes.

Writes ``benchmarks/results/dqn_pong.json`` (every run's effective config, summary, curve and
games).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
PIPELINE = ROOT / "pipelines" / "dqn_pong.yaml"
GAME_SEED = 2_000_000_000    # game seeds of this benchmark's own evaluations (training: < 1e6)

from stats import mean_ci, welch  # noqa: E402
from train_cli import train_command  # noqa: E402


def play(env, act, games: int, seed: int) -> list[float]:
    """Scores of ``games`` full games, ``act(obs)`` choosing each action."""
    scores = []
    for g in range(games):
        obs, _ = env.reset(seed=seed + g)
        score, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            score += float(reward)
            done = terminated or truncated
        scores.append(score)
    return scores


def random_games(games: int) -> list[float]:
    from dask_rl.config import load_pipeline
    from dask_rl.envs import make_env

    env = make_env(load_pipeline(PIPELINE).env)
    env.action_space.seed(GAME_SEED)
    return play(env, lambda _: env.action_space.sample(), games, GAME_SEED)


def greedy_games(run_dir: Path, games: int) -> tuple[list[float], int]:
    import torch

    from dask_rl import load_policy

    torch.set_num_threads(2)
    policy = load_policy(run_dir)
    env = policy.make_env()
    return play(env, lambda obs: policy.act(obs), games, GAME_SEED), policy.version


def _finished(run_dir: Path) -> bool:
    """Whether this run directory holds a run that ended (not one paused by Ctrl-C)."""
    path = run_dir / "summary.json"
    return path.exists() and json.loads(path.read_text()).get("stop_reason") != "interrupted"


def train(seed: int, env_steps: int, run_dir: Path) -> dict:
    """One training run in a fresh process, continued (``--resume``) where an earlier one was
    paused; returns its record, or ``{"interrupted": True}`` when it was paused again."""
    from dask_rl.data.metrics import read_metrics

    log = run_dir.parent / f"train-seed{seed}.log"
    if not _finished(run_dir):
        cmd = train_command(PIPELINE, run_dir, ["cluster.dashboard=false", f"seed={seed}",
                                                f"stop.env_steps={env_steps}"])
        resume = (run_dir / "checkpoints" / "latest").exists()
        if resume:
            cmd.append("--resume")
        with log.open("a" if resume else "w") as f:
            # Ctrl-C is the trainer's to answer (a checkpoint, then exit 130); this process
            # would otherwise kill it a quarter of a second later
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True,
                                      cwd=run_dir.parent)
            finally:
                signal.signal(signal.SIGINT, previous)
        if proc.returncode == 130:
            return {"seed": seed, "interrupted": True}
        if proc.returncode != 0:
            return {"seed": seed, "error": log.read_text()[-3000:]}
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_metrics(run_dir / "metrics.jsonl")
    config = next(r["config"] for r in records if r["kind"] == "run" and r["event"] == "start")
    evals = [{"env_steps": r["env_steps"], "mean_return": r["mean_return"],
              "episodes": r["episodes"], "purpose": r["purpose"]}
             for r in records if r["kind"] == "eval"]
    episodes = [(r["env_steps"], r["charts/episodic_return"]) for r in records
                if r["kind"] == "rollout" and r.get("charts/episodic_return") is not None]
    return {"seed": seed, "wall_s": summary["wall_s"], "config": config, "summary": summary,
            "resumes": sum(r["kind"] == "resume" for r in records),
            "screening": evals, "training_episodes": episodes}


def _tenth(episodes: list[tuple[int, float]], last: bool) -> dict | None:
    """The mean return of the first (or last) tenth of the training episodes, by count, and
    the env steps they ended at. By count, not by env steps: a resume restarts every
    environment, and Pong's long games then end no episode for tens of thousands of steps."""
    if not episodes:
        return None
    n = max(1, len(episodes) // 10)
    part = episodes[-n:] if last else episodes[:n]
    return {"mean_return": float(np.mean([r for _, r in part])), "episodes": n,
            "env_steps": [part[0][0], part[-1][0]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-steps", type=int, default=300_000, help="each run's budget")
    ap.add_argument("--seeds", type=int, default=2, help="training seeds 1..N")
    ap.add_argument("--games", type=int, default=10, help="evaluation games per side and run")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--out", default=str(HERE / "results" / "dqn_pong.json"))
    args = ap.parse_args()
    if args.games < 2 or args.seeds < 1:
        ap.error("--games must be at least 2 (a variance for Welch's test) and --seeds at least 1")

    t0 = time.time()
    rand = random_games(args.games)
    m, lo, hi = mean_ci(rand)
    print(f"random policy: {m:.1f} [{lo:.1f}, {hi:.1f}] over {len(rand)} games "
          f"({time.time() - t0:.0f} s)", flush=True)

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        for seed in range(1, args.seeds + 1):
            run_dir = base / f"seed{seed}"
            print(f"seed {seed}: training {args.env_steps} env steps (log: "
                  f"{base / f'train-seed{seed}.log'})", flush=True)
            r = train(seed, args.env_steps, run_dir)
            if r.get("interrupted"):
                hint = (f"the same command with --keep {base}" if args.keep else
                        "nothing: without --keep the run is gone")
                print(f"seed {seed}: paused at a checkpoint; to continue, run {hint}",
                      flush=True)
                return 130
            if "error" in r:
                print(f"seed {seed}: ERROR\n{r['error']}", flush=True)
                runs.append(r)
                continue
            r["games"], r["games_version"] = greedy_games(run_dir, args.games)
            r["vs_random"] = welch(r["games"], rand)
            steps = r["summary"]["env_steps"]
            # the whole run's rate (the summary's steps_per_s is its last session's)
            r["steps_per_s"] = steps / r["summary"]["wall_s"]
            r["training_first_tenth"] = _tenth(r["training_episodes"], last=False)
            r["training_last_tenth"] = _tenth(r["training_episodes"], last=True)
            runs.append(r)
            w = r["vs_random"]
            first, last = r["training_first_tenth"], r["training_last_tenth"]
            curve = (f"; training episodes, first tenth {first['mean_return']:.1f}, last "
                     f"{last['mean_return']:.1f}" if first else "")
            print(f"seed {seed}: {steps} env steps in {r['wall_s']:.0f} s "
                  f"({r['steps_per_s']:.1f}/s, {r['resumes']} resumes); greedy "
                  f"{np.mean(r['games']):.1f} over {len(r['games'])} games, vs random "
                  f"{w['diff']:+.1f} [{w['ci95'][0]:+.1f}, {w['ci95'][1]:+.1f}] p {w['p']:.3g}"
                  f"{curve}", flush=True)

    ok = [r for r in runs if "error" not in r]
    pooled = [g for r in ok for g in r["games"]]
    result = {
        "benchmark": "dqn_pong", "pipeline": str(PIPELINE.relative_to(ROOT)),
        "env_steps": args.env_steps, "seeds": list(range(1, args.seeds + 1)),
        "games_per_side": args.games, "game_seeds": [GAME_SEED, GAME_SEED + args.games - 1],
        "random": {"games": rand, "mean_ci95": mean_ci(rand)},
        "trained": {"games": pooled, "mean_ci95": mean_ci(pooled) if pooled else None,
                    "vs_random": welch(pooled, rand) if len(pooled) > 1 else None,
                    "runs": len(ok), "errors": len(runs) - len(ok)},
        "runs": runs, "wall_s": time.time() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    from stats import record_commit
    record_commit(out)
    if result["trained"]["vs_random"]:
        w = result["trained"]["vs_random"]
        print(f"trained, all games: {np.mean(pooled):.1f}; vs random {w['diff']:+.1f} "
              f"[{w['ci95'][0]:+.1f}, {w['ci95'][1]:+.1f}] p {w['p']:.3g}")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
