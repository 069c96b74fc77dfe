"""A trained policy out of a run: ``load_policy``, TorchScript and ONNX files that run where
dask-rl is not installed, and a video of a greedy episode.

Each environment family trains briefly on 2 worker processes (the weights are whatever the
run reached: the question is whether the exported file computes what the module computes);
1,000 observations from the environment itself then go through the module here and through
the exported file in a fresh interpreter in which ``import dask_rl`` fails (ONNX: ``import
torch`` fails too).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dask_rl

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

RUNS = {  # pipeline, overrides: a few updates each, and a checkpoint at the end
    "cartpole": ("ppo_cartpole.yaml", ["stop.env_steps=2048"]),
    "hopper": ("ppo_hopper_stellaris.yaml", ["stop.env_steps=2048"]),
    "pong": ("ppo_pong.yaml", ["stop.env_steps=1024", "env.num_envs=4", "rollout.steps=64",
                               "learner.epochs=1"]),   # its head is replaced anyway
}

# the exported files run in fresh interpreters: argv holds (file, observations, output) triples
TORCHSCRIPT = """
import sys
sys.modules["dask_rl"] = None          # import dask_rl fails here
import numpy as np, torch
for model, obs, out in zip(*[iter(sys.argv[1:])] * 3):
    policy = torch.jit.load(model)
    np.save(out, policy(torch.as_tensor(np.load(obs))).numpy())
"""

ONNX = """
import sys
sys.modules["dask_rl"] = None          # neither dask-rl
sys.modules["torch"] = None            # nor torch: onnxruntime alone
import numpy as np, onnxruntime
for model, obs, out in zip(*[iter(sys.argv[1:])] * 3):
    session = onnxruntime.InferenceSession(model)
    np.save(out, session.run(["action"], {"obs": np.load(obs)})[0])
"""
FORMATS = {"torchscript": TORCHSCRIPT, "onnx": ONNX}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short run per family, on one cluster of 2 worker processes."""
    from distributed import Client, LocalCluster

    root = Path(__file__).resolve().parents[2] / "pipelines"
    out = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        for name, (pipeline, overrides) in RUNS.items():
            run = tmp_path_factory.mktemp(name) / "run"
            dask_rl.train(root / pipeline, client=client, run_dir=run, overrides=[
                *overrides, "stop.solve_on_target=false", "stop.eval_every_updates=0",
                "stop.eval_episodes=1"])
            out[name] = run
    _decisive_head(out["pong"])
    return out


def _decisive_head(run: Path) -> None:
    """A few Pong updates leave the policy near its init: the torso's features hardly move
    between frames next to their mean, so one action wins on every frame, and equal actions
    would not show that a file reads its input. The run gets one more checkpoint, its newest,
    whose head reads the features' deviations from their mean over 300 frames (random weights
    over the centred features; the torso untouched), so that the greedy action depends on the
    frame."""
    import torch

    from dask_rl.checkpoint import CheckpointStore
    from dask_rl.models import get_flat

    store = CheckpointStore(run / "checkpoints")
    state, meta, _ = store.load_latest_good()
    policy = dask_rl.load_policy(run)
    with torch.no_grad():
        feats = policy.net.policy_features(torch.as_tensor(_observations(policy, 300, seed=9)))
        centred = feats - feats.mean(0)
        head = policy.net.pi_head
        w = torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0))
        w /= centred.std() + 1e-8
        head.weight.copy_(w)
        head.bias.copy_(-(w @ feats.mean(0)))
    state["actor"]["params"] = get_flat(policy.net)
    meta.pop("replay", None)
    store.save(state, meta=meta)


def _observations(policy, n=1000, seed=0):
    """``n`` observations the environment produces under random actions."""
    env = policy.make_env()
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    seen = []
    while len(seen) < n:
        seen.append(np.asarray(obs))
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(seen)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """Every family in both formats (CartPole's through the CLI, the others through
    ``dask_rl.policy.export``), run on 1,000 of its own observations in one fresh interpreter
    per format."""
    from dask_rl.policy import export

    tmp = tmp_path_factory.mktemp("exported")
    out = {}
    for family, run in trained.items():
        policy = dask_rl.load_policy(run)
        obs = _observations(policy)
        np.save(tmp / f"{family}.obs.npy", obs)
        out[family] = {"policy": policy, "expected": policy.act(obs), "files": {}}
        files = out[family]["files"]
        for fmt in FORMATS:
            files[fmt] = tmp / f"{family}.{fmt}"
            if family == "cartpole":
                cli = subprocess.run([sys.executable, "-m", "dask_rl.cli", "export", str(run),
                                      "--format", fmt, "-o", str(files[fmt])],
                                     capture_output=True, text=True, timeout=300)
                assert cli.returncode == 0, cli.stderr[-3000:]
            else:
                export(policy, files[fmt], fmt)
    for fmt, script in FORMATS.items():
        args = [str(a) for family in trained for a in
                (out[family]["files"][fmt], tmp / f"{family}.obs.npy", tmp / f"{family}.{fmt}.npy")]
        run = subprocess.run([sys.executable, "-c", script, *args],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        for family in trained:
            out[family][fmt] = np.load(tmp / f"{family}.{fmt}.npy")
    return out


@pytest.mark.parametrize("family", list(RUNS))
def test_exported_policies_act_like_the_loaded_one_without_dask_rl(exported, family):
    result = exported[family]
    policy, expected = result["policy"], result["expected"]
    assert expected.shape[0] == 1000
    # the policy tells observations apart: equal actions from a file that ignored its input
    # would not pass
    assert len(np.unique(expected, axis=0)) > 1, family
    if family == "hopper":  # the frozen statistics are inside: they are not the identity
        assert not np.allclose(policy.net.obs_norm.mean.numpy(), 0.0)
    for fmt in FORMATS:
        sidecar = json.loads(Path(f"{result['files'][fmt]}.json").read_text())
        assert sidecar["input"]["shape"][1:] == list(policy.observation_space.shape)
        got = result[fmt]
        if family == "hopper":   # continuous: float arithmetic may differ in the last bits
            np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=fmt)
        else:
            np.testing.assert_array_equal(got, expected, err_msg=fmt)


def test_a_video_of_a_greedy_cartpole_episode_has_a_frame_per_step(trained, tmp_path):
    import imageio.v3 as iio

    video = tmp_path / "episode.mp4"
    proc = subprocess.run([sys.executable, "-m", "dask_rl.cli", "evaluate",
                           str(trained["cartpole"]),
                           "--episodes", "1", "--video", str(video)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    frames = iio.imread(video, index=None)  # every frame, decoded from the file
    # CartPole pays 1 per step: the episode's return is its length
    assert frames.ndim == 4 and len(frames) == int(result["video_return"]) > 0
    assert result["video_frames"] == len(frames)


def test_the_readme_snippet_for_the_trained_policy_runs(trained, tmp_path):
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    body = text.split("\n## Use the trained policy\n", 1)[1].split("\n## ", 1)[0]
    snippet = body.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "cartpole").symlink_to(trained["cartpole"])
    (tmp_path / "snippet.py").write_text(snippet)
    proc = subprocess.run([sys.executable, "snippet.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split("return:")[1]) > 0
