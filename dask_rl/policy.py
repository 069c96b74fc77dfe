"""Trained policies out of a run: a plain torch module, TorchScript and ONNX files.

:func:`load_policy` reads a run's newest good checkpoint (or a given one) and returns a
:class:`Policy`: a ``torch.nn.Module`` whose ``forward(obs)`` is the greedy action for a batch
of observations and whose :meth:`Policy.act` takes one observation or a batch as numpy. What the
module contains:

* the network and its weights as the parameter actor held them at the checkpoint;
* observation normalisation, with the running statistics frozen at the checkpoint (MuJoCo
  pipelines with ``env.normalize_obs``), and the ``uint8`` frame scaling of the Nature CNN;
* the greedy choice: the most likely action (DQN: the largest action value, its Q-head being
  the same discrete head), the Gaussian's mean clipped to the action bounds, the argmax per
  component of a MultiDiscrete action, the ES policy's own output.

What it does *not* contain is the environment's own wrappers: for Atari, the preprocessing of
raw frames (Gymnasium's ``AtariPreprocessing``: grayscale, 84 x 84, max-pooled frame skip) and
the stack of 4 frames happen in the environment, as in training; :meth:`Policy.make_env` makes
that environment. (A module would need a stateful frame stack and OpenCV's area resize to do it
bit for bit; deviation stated, not hidden.)

:func:`export` writes the module with ``torch.jit.trace`` (TorchScript: runs with torch alone)
or ``torch.onnx.export`` (runs with ``onnxruntime`` alone); both take ``obs`` of shape
``[batch, *observation_shape]`` and return ``action`` ``[batch, *action_shape]``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from dask_rl.algos import registry
from dask_rl.checkpoint import (
    STORE_FILE,
    CheckpointError,
    CheckpointStore,
    StoreLocation,
    StoreLocationError,
)
from dask_rl.config import ConfigError, PipelineConfig, from_dict
from dask_rl.data import PolicySnapshot
from dask_rl.envs import code_named_by, env_spaces, is_atari, make_env, space_from_dict
from dask_rl.models import DeterministicPolicy, load_snapshot

logger = logging.getLogger(__name__)

FORMATS = ("torchscript", "onnx")


class Policy(nn.Module):
    """A trained policy: ``forward(obs) -> greedy action`` on a batch (see the module doc)."""

    def __init__(self, net: nn.Module, observation_space: spaces.Space,
                 action_space: spaces.Space, cfg: PipelineConfig, *, deterministic_net: bool,
                 version: int = 0, trusted: bool = True):
        super().__init__()
        self.net = net.eval()
        self.deterministic_net = deterministic_net   # ES: the net maps obs to actions itself
        self.greedy_only = not registry.get(cfg.algo.name).stochastic_policy
        self.observation_space, self.action_space = observation_space, action_space
        self.cfg, self.version = cfg, version
        self.trusted = trusted   # cfg is the user's, or vouched for: its env may be made
        self.clip = isinstance(action_space, spaces.Box) and not deterministic_net
        if self.clip:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.deterministic_net:
            return self.net(obs)
        action = self.net.policy(obs).mode()
        if self.clip:
            action = torch.max(torch.min(action, self.high), self.low)
        return action

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """The action for one observation (or a batch, with a leading batch axis), as numpy;
        ``deterministic=False`` samples the policy instead (not for ES policies)."""
        x = torch.as_tensor(np.asarray(obs))
        single = x.shape == self.observation_space.shape
        if single:
            x = x.unsqueeze(0)
        if deterministic:
            out = self.forward(x)
        elif self.greedy_only:
            raise ValueError("this policy acts greedily only (evolution strategies: a "
                             "deterministic net; DQN: action values, not a distribution); "
                             "use deterministic=True")
        else:
            out = self.net.policy(x).sample()
            if self.clip:
                out = torch.max(torch.min(out, self.high), self.low)
        out = out.cpu().numpy()
        return out[0] if single else out

    def make_env(self, **kwargs: Any):
        """The environment this policy was trained on, wrapped as in training's evaluations
        (Atari: frame preprocessing and stacking), ready for :meth:`act`; ``kwargs`` go to
        its maker (e.g. ``render_mode="rgb_array"``)."""
        require_env_trust(self.cfg.env, self.trusted, "this policy came from a checkpoint")
        env_cfg = dataclasses.replace(self.cfg.env, kwargs={**self.cfg.env.kwargs, **kwargs})
        return make_env(env_cfg)


def record_video(policy: Policy, out: str | Path, *, seed: int = 0) -> dict[str, Any]:
    """Play one greedy episode and write it as a video (imageio): one frame per action, the
    frame the policy acted on, so the video has as many frames as the episode has steps
    (Gymnasium's ``RecordVideo`` also films the final state: one more). Atari plays at the
    speed of its 4-frame skips. MuJoCo renders off-screen: ``MUJOCO_GL=egl`` where no display
    is (the CLI sets it when unset)."""
    import imageio.v2 as imageio

    try:
        env = policy.make_env(render_mode="rgb_array")
    except TypeError as e:
        raise ConfigError(f"--video: the environment does not take render_mode='rgb_array' "
                          f"({e})") from None
    try:
        obs, _ = env.reset(seed=seed)
        frames, total, done = [env.render()], 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total += float(reward)
            done = bool(terminated or truncated)
            if not done:
                frames.append(env.render())
        fps = int(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    if is_atari(policy.cfg.env):
        fps = max(1, fps // 4)   # one frame per agent step, each 4 emulator frames
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # macro_block_size=2: H.264 needs even sides; frames keep their size otherwise
    imageio.mimwrite(out, frames, fps=fps, macro_block_size=2)
    return {"video": str(out), "video_frames": len(frames), "video_return": total}


def find_store(path: Path) -> tuple[str, str | None]:
    """(checkpoint store, checkpoint name or None for the newest) for a run directory (its
    store wherever ``checkpoint.path`` put it: ``RUN_DIR/store.json``), a store directory or
    one checkpoint in it."""
    try:
        where = StoreLocation.find(path)
    except StoreLocationError as e:
        raise ConfigError(str(e)) from None
    if where is not None and (path / STORE_FILE).exists():
        return where.path, None
    if (path / "checkpoints").is_dir():
        return str(path / "checkpoints"), None
    if path.name.startswith("ckpt-") and path.parent.is_dir():
        return str(path.parent), path.name
    if path.is_dir() and any(p.name.startswith("ckpt-") for p in path.iterdir()):
        return str(path), None
    members = path / "members"
    if members.is_dir():
        raise ConfigError(f"{path}: a population run has one checkpoint store per member; "
                          f"give one, e.g. {sorted(members.iterdir())[0]}")
    raise ConfigError(f"{path}: no checkpoints here; give a run directory or a checkpoint")


def load_policy(path: str | Path, *, checkpoint: str | None = None,
                pipeline: str | Path | PipelineConfig | None = None,
                trust: bool = False) -> Policy:
    """The policy of a run directory's newest good checkpoint (or of ``path`` when it is a
    checkpoint, or of ``checkpoint`` by name), as a :class:`Policy` on the CPU.

    A checkpoint is data: nothing it names is imported or called. Its spaces come from its
    metadata; its environment is made (:meth:`Policy.make_env`) only when it is an id
    Gymnasium's registry already has, when you give the run's ``pipeline`` (a YAML path or a
    config: its environment is used), or with ``trust=True`` (the checkpoint's own config,
    code included: only for checkpoints you wrote).
    """
    store_dir, name = find_store(Path(path))
    if pipeline is not None and not isinstance(pipeline, PipelineConfig):
        from dask_rl.config import load_pipeline

        pipeline = load_pipeline(pipeline)
    return policy_from_store(CheckpointStore(store_dir), checkpoint or name, cfg=pipeline,
                             trust=trust)


def policy_from_store(store: CheckpointStore, checkpoint: str | None = None, *,
                      cfg: PipelineConfig | None = None, trust: bool = False) -> Policy:
    """The policy of a checkpoint store's newest good checkpoint (or of ``checkpoint``);
    ``cfg`` and ``trust`` as in :func:`load_policy`."""
    try:
        if checkpoint:
            state, meta = store.load(checkpoint)
        else:
            state, meta, _ = store.load_latest_good()
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    trusted = trust or cfg is not None   # the user's own pipeline is vouched for
    cfg = checkpoint_config(meta, cfg)
    if "spaces" in meta:
        try:
            obs_space = space_from_dict(meta["spaces"]["observation"])
            action_space = space_from_dict(meta["spaces"]["action"])
        except Exception as e:  # a damaged or crafted description
            raise ConfigError(f"{store.root}: the checkpoint's spaces are unreadable: "
                              f"{' '.join(str(e).split())[:200]}") from None
    else:  # written before spaces were kept: only the environment can tell
        require_env_trust(cfg.env, trusted, f"{store.root}: the checkpoint records no spaces "
                          f"(an older dask-rl), so its environment must be made")
        obs_space, action_space = env_spaces(cfg.env)
    algorithm = registry.build(cfg.algo)
    actor = state["actor"]
    snapshot = PolicySnapshot(int(actor["version"]), actor["params"], actor.get("moments"))
    net = algorithm.make_model(obs_space, action_space, cfg.model,
                               normalize_obs=cfg.env.normalize_obs)
    try:
        load_snapshot(net, snapshot)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"{store.root}: the checkpoint does not fit its model: "
                          f"{' '.join(str(e).split())[:200]}") from None
    return Policy(net, obs_space, action_space, cfg,
                  deterministic_net=isinstance(net, DeterministicPolicy),
                  version=snapshot.version,
                  trusted=trusted)


def checkpoint_config(meta: dict[str, Any], pipeline: PipelineConfig | None = None
                      ) -> PipelineConfig:
    """The config a checkpoint was written with, read as data (no environment is checked,
    nothing is imported); with ``pipeline`` (the user's), that pipeline, once it is shown to
    be the checkpoint's algorithm (its environment is the user's choice)."""
    saved = meta.get("config")
    if not isinstance(saved, dict):
        raise ConfigError("the checkpoint records no pipeline config")
    try:
        cfg = from_dict(saved, check_env=False)
    except ConfigError as e:
        raise ConfigError(f"the checkpoint's config is not valid here: {e}") from None
    if pipeline is None:
        return cfg
    if pipeline.algo.name != cfg.algo.name:
        raise ConfigError(f"--pipeline: its algo.name is {pipeline.algo.name!r}, the "
                          f"checkpoint's is {cfg.algo.name!r}")
    if pipeline.env.name != cfg.env.name:   # yours to choose (a variant, a local copy)
        logger.warning("the checkpoint was trained on %s; using your pipeline's %s",
                       cfg.env.name, pipeline.env.name)
    return pipeline


def require_env_trust(env: Any, trusted: bool, why: str) -> None:
    """ConfigError unless making ``env`` runs no code the checkpoint names (or ``trusted``)."""
    if trusted:
        return
    named = code_named_by(env)
    if named is not None:
        raise ConfigError(f"{why}, and it names code ({named}); a checkpoint is data: give "
                          f"the run's pipeline (--pipeline PIPELINE.yaml) or, for a "
                          f"checkpoint you wrote, --trust-checkpoint")


def require(module: str, extra: str, what: str) -> None:
    """One line (exit 2) instead of an ImportError traceback when an extra is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{what} needs the {module} package: pip install 'dask-rl[{extra}]'")


def example_observations(policy: Policy, n: int = 2, seed: int = 0) -> torch.Tensor:
    """``n`` observations sampled from the policy's observation space (for tracing)."""
    space = policy.observation_space
    space.seed(seed)
    return torch.as_tensor(np.stack([space.sample() for _ in range(n)]))


def export(policy: Policy, out: str | Path, fmt: str = "torchscript") -> Path:
    """Write ``policy`` as TorchScript (``torch.jit.load``) or ONNX (``onnxruntime``): input
    ``obs`` ``[batch, *observation_shape]``, output ``action``. A JSON sidecar
    ``<file>.json`` says what goes in and comes out."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "onnx":
        require("onnxscript", "export", "ONNX export")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    example = example_observations(policy)
    if fmt == "torchscript":
        traced = torch.jit.trace(policy, example, check_trace=False)
        traced.save(str(out))
    else:
        batch = torch.export.Dim("batch")
        program = torch.onnx.export(policy, (example,), input_names=["obs"],
                                    output_names=["action"], dynamic_shapes=({0: batch},),
                                    dynamo=True, verbose=False)
        if program is None:
            raise RuntimeError("torch.onnx.export returned nothing: ONNX export needs torch "
                               ">= 2.5 with onnxscript (pip install 'dask-rl[export]')")
        program.save(str(out))
    sidecar = {"format": fmt, "env": policy.cfg.env.name, "algorithm": policy.cfg.algo.name,
               "version": policy.version, "input": {"name": "obs", "shape": [
                   "batch", *policy.observation_space.shape],
                   "dtype": str(policy.observation_space.dtype)},
               "output": {"name": "action", "space": str(policy.action_space)},
               "preprocessing": "observations as the training environment's wrappers give "
                                "them (Atari: 84x84 grayscale, 4 stacked frames); "
                                "normalisation is inside"}
    out.with_suffix(out.suffix + ".json").write_text(json.dumps(sidecar, indent=2))
    return out
