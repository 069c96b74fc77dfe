"""dask-rl beside the frameworks a user would pick instead, on the same two cores.

Four sides train the same env, each as its users run it, with its own documented settings:

* ``dask_rl`` — a shipped pipeline on the embedded 2-worker cluster (``peer_sides/dask_rl_ppo.py``);
* ``cleanrl`` — a CleanRL-style single-file PPO in one process (``peer_sides/cleanrl_ppo.py``);
* ``rllib`` — RLlib's PPO with its tuned example's settings, 2 env runners
  (``peer_sides/rllib_ppo.py``, in its own venv);
* ``sample_factory`` — Sample Factory 2.1.1's APPO with its example's settings, 2 workers
  (``peer_sides/sf_appo.py``, in its own venv: it pins ``numpy<2``, ``gymnasium<1.0``).

Every side gets the row's env-step budget and wall-clock cap, counted from its spawn (a fresh
process: interpreter start-up, imports, cluster start-up are in its wall time), and takes a
snapshot of its greedy policy each time its env steps cross the same grid (TorchScript, any
observation normaliser frozen in: ``peer_sides/common.py``); the snapshots' cost is recorded per
side. The venvs are built by ``peer_venvs.py`` before the first run (not timed).

One judge, here (dask-rl's venv, one Gymnasium), evaluates every side's snapshots the same way,
greedy, on fresh seeds shared by all sides:

* **time to target**: snapshots in order are screened (10 episodes); the first whose screen
  reaches the target is confirmed on 100 fresh episodes; the first confirmed is the time (its
  wall since spawn). None within the cap: censored (infinite in the medians);
* **return at equal wall time**: at each wall point W, the newest snapshot taken by W,
  evaluated on 30 fresh episodes (a side with none yet scores nothing: ``null``);
* **env steps/s** between a side's first and last progress records (its steady rate), and the
  start-up: spawn to the first progress record, and that line's intercept at 0 env steps;
* **peak memory** of the whole process tree (every process of the side's session, Ray's daemons
  included), as the peak sum of PSS (shared pages split between the processes that map them)
  and of RSS, sampled every 0.5 s.

Sides run one at a time; the order rotates with the seed so that machine noise hits all alike.

    python benchmarks/peers.py --row cartpole --seeds 5
    python benchmarks/peers.py --row hopper --seeds 5

Writes ``benchmarks/results/peers_<row>.json``: each side's exact command, versions, settings
and where they are documented, every run's figures, and per side means / medians with 95% CIs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIDES_DIR = HERE / "peer_sides"
sys.path.insert(0, str(HERE))
import peer_venvs  # noqa: E402

ROWS = {
    "cartpole": dict(env="CartPole-v1", budget=500_000, cap_s=150.0, grid=10_000,
                     target=475.0, walls=[10, 20, 30, 45, 60, 90, 120, 150]),
    # Hopper-v4 for every side: Sample Factory's gymnasium (0.29) has no v5. Half a million
    # steps in 150 s: the fastest sides finish the budget near the cap, and the row's
    # 5 seeds x 4 sides fit in about an hour of the machine
    "hopper": dict(env="Hopper-v4", budget=500_000, cap_s=150.0, grid=20_000,
                   target=1_000.0, walls=[15, 30, 45, 60, 90, 120, 150]),
}
SIDES = ("dask_rl", "cleanrl", "rllib", "sample_factory")
SCRIPT = {"dask_rl": "dask_rl_ppo.py", "cleanrl": "cleanrl_ppo.py", "rllib": "rllib_ppo.py",
          "sample_factory": "sf_appo.py"}
EXPORTS = {"dask_rl", "sample_factory"}   # snapshots written after the timed run
SCREEN, CONFIRM, AT_WALL = 10, 100, 30
GRACE_S = 90.0   # past the cap before a side is killed (a last iteration, shutdown)


def python_of(side: str, venvs: Path) -> str:
    if side in peer_venvs.REQUIREMENTS:
        return str(peer_venvs.python(side, venvs))
    return sys.executable


# ---- running one side ------------------------------------------------------------------------
class TreeMemory(threading.Thread):
    """Peak PSS and RSS summed over every process in session ``sid`` (the side's tree)."""

    def __init__(self, sid: int, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.sid, self.every_s = sid, every_s
        self.peak_pss = self.peak_rss = 0
        self.peak_procs = 0
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.done.is_set():
            pss = rss = n = 0
            for p in psutil.process_iter():
                try:
                    if os.getsid(p.pid) != self.sid:
                        continue
                    m = p.memory_full_info()
                except (psutil.Error, ProcessLookupError, PermissionError):
                    continue
                pss, rss, n = pss + m.pss, rss + m.rss, n + 1
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, n)
            self.done.wait(self.every_s)


def side_command(side: str, row: dict, seed: int, out: Path, venvs: Path, spawn: float
                 ) -> list[str]:
    return [python_of(side, venvs), str(SIDES_DIR / SCRIPT[side]), "--env", row["env"],
            "--seed", str(seed), "--budget", str(row["budget"]), "--cap-s", str(row["cap_s"]),
            "--grid", str(row["grid"]), "--spawn", repr(spawn), "--out", str(out)]


def run_side(side: str, row: dict, seed: int, out: Path, venvs: Path) -> dict:
    """Train one side in its own session; its figures from its records."""
    out.mkdir(parents=True, exist_ok=True)
    spawn = time.time()
    cmd = side_command(side, row, seed, out, venvs, spawn)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        memory = TreeMemory(proc.pid)
        memory.start()
        killed = False
        try:
            rc = proc.wait(timeout=row["cap_s"] + GRACE_S)
        except subprocess.TimeoutExpired:
            killed, rc = True, None
        wall = time.time() - spawn
        memory.done.set()
        memory.join()
        for sig in (signal.SIGTERM, signal.SIGKILL):   # the tree, stragglers included
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(2.0)
        proc.wait()
    if side in EXPORTS and (out / ("raw" if side == "dask_rl" else "sf")).exists():
        subprocess.run([python_of(side, venvs), str(SIDES_DIR / SCRIPT[side]), "--env",
                        row["env"], "--spawn", repr(spawn), "--out", str(out), "--export"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = _jsonl(out / "progress.jsonl")
    info = json.loads((out / "side.json").read_text()) if (out / "side.json").exists() else {}
    return {"side": side, "seed": seed, "rc": rc, "killed": killed, "process_wall_s": wall,
            "peak_pss_mb": memory.peak_pss / 2**20, "peak_rss_mb": memory.peak_rss / 2**20,
            "peak_processes": memory.peak_procs, "snapshot_s": info.get("snapshot_s"),
            **rates(progress), "command": cmd, "side_record": info}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def rates(progress: list[dict]) -> dict:
    """Env steps/s between the first and last progress records; the start-up."""
    if len(progress) < 2:
        return {"env_steps": progress[-1]["env_steps"] if progress else 0,
                "env_steps_per_s": None, "first_record_s": None, "startup_intercept_s": None}
    a, b = progress[0], progress[-1]
    rate = (b["env_steps"] - a["env_steps"]) / max(1e-9, b["wall_s"] - a["wall_s"])
    return {"env_steps": b["env_steps"], "env_steps_per_s": rate,
            "first_record_s": a["wall_s"], "first_record_steps": a["env_steps"],
            "startup_intercept_s": a["wall_s"] - a["env_steps"] / rate,
            "train_return_last": b.get("train_return")}


# ---- the judge -------------------------------------------------------------------------------
def evaluate(policy, env_id: str, episodes: int, seed: int) -> float:
    """Mean undiscounted return of ``policy`` (TorchScript: obs batch -> greedy action) over
    ``episodes`` episodes, the i-th reset with ``seed + i``, all stepped together."""
    import gymnasium as gym
    import torch

    envs = [gym.make(env_id) for _ in range(episodes)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    total = np.zeros(episodes)
    alive = list(range(episodes))
    with torch.no_grad():
        while alive:
            x = torch.as_tensor(np.stack([obs[i] for i in alive]), dtype=torch.float32)
            actions = policy(x).numpy()
            still = []
            for i, a in zip(alive, actions):
                obs[i], r, term, trunc, _ = envs[i].step(a.item() if a.ndim == 0 else a)
                total[i] += r
                if not (term or trunc):
                    still.append(i)
            alive = still
    for e in envs:
        e.close()
    return float(total.mean())


def judge(out: Path, row: dict, seed: int) -> dict:
    import torch

    torch.set_num_threads(1)
    snaps = [s for s in _jsonl(out / "snapshots.jsonl") if s["wall_s"] <= row["cap_s"]]
    cache: dict = {}

    def policy(k: int):
        if k not in cache:
            cache[k] = torch.jit.load(str(out / snaps[k]["file"]))
        return cache[k]

    screens, tried, solved = [], [], None
    for k, s in enumerate(snaps):   # the same evaluation seeds for every side at rank k
        ret = evaluate(policy(k), row["env"], SCREEN, 10_000_000 + 1_000 * seed + 100_000 * k)
        screens.append({"env_steps": s["env_steps"], "wall_s": s["wall_s"], "return": ret})
        if solved is None and ret >= row["target"]:
            conf = evaluate(policy(k), row["env"], CONFIRM,
                            20_000_000 + 1_000 * seed + 100_000 * k)
            tried.append({"env_steps": s["env_steps"], "screen": ret, "confirm": conf})
            if conf >= row["target"]:
                solved = s
    at_wall = {}
    for w in row["walls"]:
        ks = [k for k, s in enumerate(snaps) if s["wall_s"] <= w]
        at_wall[str(w)] = None if not ks else evaluate(
            policy(ks[-1]), row["env"], AT_WALL, 30_000_000 + 1_000 * seed + 10_000 * w)
    return {"solved": solved is not None,
            "time_to_target_s": solved["wall_s"] if solved else math.inf,
            "steps_to_target": solved["env_steps"] if solved else math.inf,
            "confirmations": tried, "return_at_wall": at_wall, "screens": screens,
            "snapshots": len(snaps)}


# ---- the table -------------------------------------------------------------------------------
def summarise(rows: list[dict], row: dict, sides: list[str]) -> dict:
    from stats import bootstrap_ci, bootstrap_ratio_ci, mean_ci

    def mci(xs):
        xs = [x for x in xs if x is not None and math.isfinite(x)]
        if not xs:
            return None
        m, lo, hi = mean_ci(xs)
        return {"mean": m, "ci95": [lo, hi], "n": len(xs)}

    table = {}
    for side in sides:
        mine = [r for r in rows if r["side"] == side]
        times = [r["time_to_target_s"] for r in mine]
        med, (lo, hi) = float(np.median(times)), _censored(bootstrap_ci(_uncensor(times),
                                                                          np.median))
        table[side] = {
            "runs": len(mine), "solved": sum(r["solved"] for r in mine),
            "time_to_target_s": {"median": med, "ci95": [lo, hi], "per_seed": times},
            "time_to_target_s_mean_solved": mci(times),
            "steps_to_target_median": float(np.median([r["steps_to_target"] for r in mine])),
            "return_at_wall": {w: mci([r["return_at_wall"][w] for r in mine])
                               for w in map(str, row["walls"])},
            "env_steps_per_s": mci([r["env_steps_per_s"] for r in mine]),
            "peak_pss_mb": mci([r["peak_pss_mb"] for r in mine]),
            "peak_rss_mb": mci([r["peak_rss_mb"] for r in mine]),
            "first_record_s": mci([r["first_record_s"] for r in mine]),
            "startup_intercept_s": mci([r["startup_intercept_s"] for r in mine]),
            "snapshot_s_per_run": mci([r["snapshot_s"] for r in mine]),
            "env_steps_at_end": mci([r["env_steps"] for r in mine]),
        }
    ours = [r for r in rows if r["side"] == "dask_rl"]
    ratios = {}
    for side in sides:
        theirs = [r for r in rows if r["side"] == side]
        if side == "dask_rl" or not ours or not theirs:
            continue
        entry = {}
        for key, stat in (("time_to_target_s", np.median), ("peak_pss_mb", np.mean),
                          ("env_steps_per_s", np.mean)):
            a = [r[key] for r in ours]
            b = [r[key] for r in theirs]
            if any(x is None for x in a + b):
                continue
            ratio, lo, hi = _censored(bootstrap_ratio_ci(_uncensor(a), _uncensor(b), stat))
            entry[key] = {"dask_rl_over_side": ratio, "ci95": [lo, hi]}
        ratios[side] = entry
    return {"sides": table, "ratios": ratios}


BIG = 1e12   # an unsolved run's time, inside the bootstrap (arithmetic on inf gives nan)


def _uncensor(xs):
    return [BIG if math.isinf(x) else x for x in xs]


def _censored(xs):
    return tuple(math.inf if x >= BIG / 1e3 else 0.0 if x <= 1e3 / BIG else x for x in xs)


def side_info(side: str, venvs: Path) -> dict:
    if side in peer_venvs.REQUIREMENTS:
        return {"venv": str(venvs / side), "requirements": [peer_venvs.TORCH,
                                                            *peer_venvs.REQUIREMENTS[side]],
                "versions": peer_venvs.versions(side, venvs)}
    import importlib.metadata as m

    return {"venv": sys.prefix, "versions": {p: m.version(p) for p in
                                             ("dask-rl", "dask", "distributed", "gymnasium",
                                              "numpy", "torch", "mujoco")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", choices=list(ROWS), required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=1001,
                    help="seeds first-seed, ... (no side's settings were tuned on any seed)")
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="change the row: budget=..., cap_s=..., grid=..., target=...")
    ap.add_argument("--venvs", type=Path, default=peer_venvs.DEFAULT_ROOT)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dask-rl-peers-work"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    row = dict(ROWS[args.row])
    for s in args.sets:
        key, _, value = s.partition("=")
        if key not in row or key in ("env", "walls"):
            ap.error(f"--set {s}: one of budget, cap_s, grid, target")
        row[key] = type(row[key])(float(value))
    for side in args.sides:
        if side in peer_venvs.REQUIREMENTS:
            peer_venvs.build(side, args.venvs)
    info = {side: side_info(side, args.venvs) for side in args.sides}
    rows = []
    for n in range(args.seeds):
        seed = args.first_seed + n
        order = args.sides[n % len(args.sides):] + args.sides[:n % len(args.sides)]
        for side in order:
            out = args.work / args.row / f"{side}-{seed}"
            if out.exists():
                subprocess.run(["rm", "-rf", str(out)], check=True)
            r = run_side(side, row, seed, out, args.venvs)
            r.update(judge(out, row, seed))
            rows.append(r)
            print(f"{args.row} {side:14s} seed {seed}: target "
                  f"{'%.1f s' % r['time_to_target_s'] if r['solved'] else 'missed'}, "
                  f"{r['env_steps']} steps, {r['env_steps_per_s'] or 0:.0f} steps/s, "
                  f"PSS {r['peak_pss_mb']:.0f} MB, return at walls "
                  f"{[None if v is None else round(v) for v in r['return_at_wall'].values()]}",
                  flush=True)
    from stats import json_safe, record_commit

    result = {"row": {"name": args.row, **row}, "seeds": list(range(args.first_seed,
                                                                    args.first_seed + args.seeds)),
              "judge": {"screen_episodes": SCREEN, "confirm_episodes": CONFIRM,
                        "episodes_at_wall": AT_WALL, "greedy": True},
              "sides_info": info, **summarise(rows, row, args.sides), "runs": rows}
    out = args.out or HERE / "results" / f"peers_{args.row}.json"
    out.write_text(json.dumps(json_safe(result), indent=2))
    record_commit(out)
    print(json.dumps(json_safe(result["sides"]), indent=1)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
