"""dask-rl's side of ``benchmarks/peers.py``: a shipped pipeline, as ``dask-rl train`` runs it.

The pipeline (``pipelines/ppo_cartpole.yaml``, ``pipelines/ppo_hopper_stellaris.yaml``) runs on
its embedded 2-worker ``LocalCluster``, started as the CLI starts it (the warm worker process
first, then the pipeline's ``cluster:`` section), with the row's budget
(``stop.env_steps``), its wall-clock cap (``stop.wall_s``, counted from the spawn) and its seed.
Two changes, both because the common judge replaces them: no stop on the target
(``stop.solve_on_target=false``) and no periodic evaluation of its own
(``stop.eval_every_updates=0``); the pipeline's checkpoints stay on, as a user has them.

Each time the learned env steps cross the grid the driver pulls the parameter actor's current
version (a copy of the flat parameters and the observation statistics: training goes on) and
writes it to disk at once, so that a kill at the cap loses nothing. ``--export`` (after the
timed run, as Sample Factory's milestones are) turns each into the common TorchScript snapshot
with ``dask_rl.policy.Policy``: the greedy action behind the frozen observation normaliser.
"""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPELINES = HERE.parent.parent / "pipelines"
PIPELINE = {"CartPole": "ppo_cartpole.yaml", "Hopper": "ppo_hopper_stellaris.yaml"}


def config(env: str, seed: int, budget: int, wall_s: float):
    from dask_rl.api import resolve

    return resolve(PIPELINES / PIPELINE[env.split("-")[0]],
                   [f"env.id={env}", f"seed={seed}", f"stop.env_steps={budget}",
                    f"stop.wall_s={wall_s:.1f}", "stop.solve_on_target=false",
                    "stop.eval_every_updates=0"])


def train(args) -> None:
    from dask_rl.runtime.worker_start import warm_start

    warm_start()
    from common import Record

    from dask_rl.runtime.cluster import connect
    from dask_rl.runtime.driver import Driver

    rec = Record(args.out, args.spawn, args.grid)
    cfg = config(args.env, args.seed, args.budget, max(1.0, args.cap_s - rec.now()))
    raw = Path(args.out) / "raw"
    raw.mkdir(exist_ok=True)
    driver: list = []

    def progress(p) -> None:
        rec.progress(p.env_steps, p.recent_return)
        if rec.due(p.env_steps):
            t0 = time.perf_counter()
            wall = rec.now()
            snap = driver[0].actor_call("pull")
            path = raw / f"{p.env_steps:010d}.pkl"
            path.write_bytes(pickle.dumps({"env_steps": p.env_steps, "wall_s": wall,
                                           "version": snap.version, "params": snap.params,
                                           "moments": snap.moments}))
            while rec.next_snapshot <= p.env_steps:
                rec.next_snapshot += rec.grid
            rec.snapshot_s += time.perf_counter() - t0

    with connect(cfg.cluster) as client, tempfile.TemporaryDirectory() as run_dir:
        driver.append(Driver(client, cfg, run_dir, progress=progress))
        summary = driver[0].run()
    from dask_rl.config import public_dict

    rec.close(env_steps=summary.env_steps, config=public_dict(cfg),
              settings_source=f"pipelines/{PIPELINE[args.env.split('-')[0]]}",
              staleness_mean=summary.staleness_mean)


def export(args) -> None:
    import torch
    from common import write_snapshots

    from dask_rl.algos import registry
    from dask_rl.config import from_dict
    from dask_rl.data import PolicySnapshot
    from dask_rl.envs import env_spaces
    from dask_rl.models import DeterministicPolicy, load_snapshot
    from dask_rl.policy import Policy

    out = Path(args.out)
    cfg = from_dict(json.loads((out / "side.json").read_text())["config"])
    obs_space, action_space = env_spaces(cfg.env)
    algorithm = registry.build(cfg.algo)

    def taken():
        for f in sorted((out / "raw").glob("*.pkl")):
            raw = pickle.loads(f.read_bytes())
            net = algorithm.make_model(obs_space, action_space, cfg.model,
                                       normalize_obs=cfg.env.normalize_obs)
            load_snapshot(net, PolicySnapshot(raw["version"], raw["params"], raw["moments"]))
            policy = Policy(net, obs_space, action_space, cfg,
                            deterministic_net=isinstance(net, DeterministicPolicy))
            yield raw["env_steps"], raw["wall_s"], policy, torch.zeros((2, *obs_space.shape))

    write_snapshots(out, taken())


def main() -> int:
    sys.path.insert(0, str(HERE))  # common.py, shared with the peers' venvs
    from common import side_args

    args = side_args()
    export(args) if args.export else train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
