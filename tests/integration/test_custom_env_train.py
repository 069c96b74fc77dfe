"""Your own environment trains on a LocalCluster with worker processes: by ``module:id`` and by
``entry_point`` through the CLI, with a class through the Python API, and with code the workers
only get from ``cluster.upload``.

The corridor (``tests/assets/toyenvs``) is registered nowhere and installed nowhere; walking
right reaches the goal in 5 steps (return 0.95), so a run that solves it (target 0.9, confirmed
on 20 greedy episodes) learned.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dask_rl

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"

PIPELINE = """\
algo: {name: ppo, ent_coef: 0.01}
env: {%s, num_envs: 4}
rollout: {steps: 32}
learner: {lr: 1.0e-3, max_learners: 2, epochs: 4, minibatches: 2}
stop: {env_steps: 40000, target_return: 0.9, eval_episodes: 5, eval_every_updates: 10}
checkpoint: {every_s: 0}
cluster: {n_workers: 2, threads_per_worker: 1, dashboard: false}
"""


def _cli(tmp_path: Path, env: str) -> dict:
    pipeline = tmp_path / "mine.yaml"
    pipeline.write_text(PIPELINE % env)
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dask_rl.cli", "train", str(pipeline), "--run-dir", str(run),
         "--no-progress"], capture_output=True, text=True, cwd=tmp_path, timeout=500,
        env={**os.environ,
             "PYTHONPATH": os.pathsep.join([str(ASSETS), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run / "summary.json").read_text())


def test_the_cli_trains_an_environment_by_module_and_id(tmp_path):
    s = _cli(tmp_path, "id: 'toyenvs.registered:Corridor-v0'")
    assert s["env_id"] == "toyenvs.registered:Corridor-v0"
    assert s["solved"] and s["confirmation"]["mean_return"] >= 0.9, s


def test_a_policy_trained_on_your_environment_comes_out(tmp_path):
    """load_policy, export and a video of a run on an entry point (its saved config names the
    environment by the entry point alone): the policy comes out as data; making the
    environment the checkpoint names takes the user's word (trust, or their pipeline)."""
    s = _cli(tmp_path, "entry_point: 'toyenvs.corridor:Corridor'")
    assert s["solved"], s
    run = tmp_path / "run"
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ASSETS), os.environ.get("PYTHONPATH", "")])}
    script = ("import sys, dask_rl, numpy as np\n"
              "p = dask_rl.load_policy(sys.argv[1], trust=True)\n"
              "env = p.make_env(); obs, _ = env.reset(seed=0); steps = 0; done = False\n"
              "while not done:\n"
              "    obs, r, term, trunc, _ = env.step(p.act(obs))\n"
              "    steps += 1; done = term or trunc\n"
              "print(steps)\n")
    walked = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True,
                            text=True, timeout=120, env=env)
    assert walked.returncode == 0 and walked.stdout.strip() == "5", walked.stderr[-2000:]
    out = tmp_path / "corridor.pt"
    export = subprocess.run([sys.executable, "-m", "dask_rl.cli", "export", str(run),
                             "-o", str(out)], capture_output=True, text=True, timeout=120,
                            env=env)
    assert export.returncode == 0 and out.exists(), export.stderr[-2000:]
    evaluate = [sys.executable, "-m", "dask_rl.cli", "evaluate", str(run), "--episodes", "1"]
    refused = subprocess.run(evaluate, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2 and "--trust-checkpoint" in refused.stderr, refused.stderr
    video = subprocess.run(evaluate + ["--trust-checkpoint", "--video",
                                       str(tmp_path / "walk.mp4")],
                           capture_output=True, text=True, timeout=120, env=env)
    assert video.returncode == 0, video.stderr[-2000:]
    assert json.loads(video.stdout)["video_frames"] == 5   # 5 steps right to the goal


def test_the_cli_trains_an_environment_by_entry_point_with_kwargs(tmp_path):
    s = _cli(tmp_path, "entry_point: 'toyenvs.corridor:make_corridor', kwargs: {length: 5}")
    assert s["env_id"] == "toyenvs.corridor:make_corridor"
    # 4 steps right in a corridor of 5: 0.96; the kwargs reached the workers' environments
    assert s["solved"] and s["confirmation"]["mean_return"] == pytest.approx(0.96), s


@pytest.fixture
def cluster_client(monkeypatch):
    """2 worker processes; ``toyenvs`` is on the path before they start, so they import it."""
    from distributed import Client, LocalCluster

    monkeypatch.syspath_prepend(str(ASSETS))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        yield client


def _train(client, run_dir, env, **extra):
    return dask_rl.train(
        {"algo": {"name": "ppo", "ent_coef": 0.01}, "env": {"num_envs": 4},
         "rollout": {"steps": 32},
         "learner": {"lr": 1e-3, "max_learners": 2, "epochs": 4, "minibatches": 2},
         "stop": {"env_steps": 40000, "target_return": 0.9, "eval_episodes": 5,
                  "eval_every_updates": 10},
         "checkpoint": {"every_s": 0}, **extra},
        client=client, run_dir=run_dir, env=env).summary


def test_the_python_api_trains_a_class_defined_in_the_test(cluster_client, tmp_path):
    from toyenvs.corridor import Corridor

    class Shorter(Corridor):  # defined here: the workers get it by value
        def __init__(self):
            super().__init__(length=4)

    s = _train(cluster_client, tmp_path / "class", Shorter)
    assert s["env_id"].endswith("Shorter")
    assert s["solved"] and s["confirmation"]["mean_return"] == pytest.approx(0.97), s


def test_dict_observations_and_multidiscrete_actions_train(cluster_client, tmp_path):
    from toyenvs.corridor import DictCorridor

    s = _train(cluster_client, tmp_path / "dict", DictCorridor)
    assert s["solved"] and s["confirmation"]["mean_return"] == pytest.approx(0.95), s


def test_code_the_workers_lack_reaches_them_with_cluster_upload(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    package = tmp_path / "src" / "uploaded_corridor"
    shutil.copytree(ASSETS / "toyenvs", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (package / "registered.py").unlink()  # it registers toyenvs' id; not needed here
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        # the workers started without the package: only this driver can import it
        monkeypatch.syspath_prepend(str(package.parent))
        assert not any(client.run(
            lambda: importlib.util.find_spec("uploaded_corridor") is not None).values())
        s = _train(client, tmp_path / "upload", "uploaded_corridor.corridor:Corridor",
                   cluster={"upload": [str(package)]})
        found = client.run(lambda: importlib.util.find_spec("uploaded_corridor").origin)
    assert s["solved"], s
    assert all(".zip" in origin for origin in found.values()), found



def _readme_block(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return body.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_snippet_for_your_own_environment_runs(tmp_path):
    (tmp_path / "snippet.py").write_text(_readme_block("Your own environment"))
    proc = subprocess.run([sys.executable, "snippet.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "solved: True" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert (tmp_path / "runs" / "corridor" / "summary.json").exists()
