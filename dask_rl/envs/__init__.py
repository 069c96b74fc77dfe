"""Environment factory: Gymnasium ids to seeded vector environments.

Every vector env made here autoresets in the *same step* (an episode's last transition returns
the first observation of the next episode, the final observation sits in ``info["final_obs"]``),
so every stored transition is a real one, and records true episode returns before any wrapper
that changes rewards or episode ends (Atari's episodic life).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs import registration
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from dask_rl.config.schema import EnvConfig

__all__ = ["make_env", "make_vector_env", "env_spaces", "check_env_id", "env_family", "is_atari",
           "reward_threshold", "episode_stats"]


@functools.lru_cache(maxsize=None)
def _register_optional() -> None:
    try:
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:
        pass


def is_atari(env_id: str) -> bool:
    """True for Arcade Learning Environment ids (``ALE/Pong-v5``, ``PongNoFrameskip-v4``)."""
    _register_optional()
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return env_id.startswith("ALE/")
    return "ale_py" in str(spec.entry_point)


#: Environment families whose dependencies come with an extra of dask-rl (pyproject.toml).
EXTRAS = {"atari": "Atari", "mujoco": "MuJoCo"}


def env_family(env_id: str) -> str | None:
    """``atari``, ``mujoco`` or None (classic control and other Gymnasium environments)."""
    if is_atari(env_id):
        return "atari"
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        return None
    return "mujoco" if "mujoco" in entry_point else None


def check_env_id(env_id: str) -> str | None:
    """None if ``env_id`` can be made here, else a one-line reason.

    The environment's module is imported (not only its registration looked up), so a missing
    dependency is found before any cluster starts, and the reason names the extra that
    installs it, e.g. ``pip install 'dask-rl[mujoco]'``.
    """
    _register_optional()
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        if env_id.startswith("ALE/") or "NoFrameskip" in env_id:
            return _needs_extra("atari", "ale_py is not installed")
        return "unknown Gymnasium environment id"
    family = env_family(env_id)
    missing = _missing_module(spec.entry_point, family)
    if missing is None:
        return None
    if family is None:
        return f"this environment needs a module that is not installed ({missing})"
    return _needs_extra(family, missing)


def _needs_extra(family: str, missing: str) -> str:
    return (f"{EXTRAS[family]} environments need the '{family}' extra: "
            f"pip install 'dask-rl[{family}]' ({missing})")


def _missing_module(entry_point: Any, family: str | None) -> str | None:
    """What the environment's code cannot import, as a short phrase, if anything."""
    try:
        if isinstance(entry_point, str):
            registration.load_env_creator(entry_point)
        if family == "atari":  # Gymnasium's Atari preprocessing resizes frames with OpenCV
            importlib.import_module("cv2")
    except ImportError as e:
        return f"{e.name} is not installed" if e.name else " ".join(str(e).split())
    except gym.error.DependencyNotInstalled as e:
        cause = e.__cause__ if isinstance(e.__cause__, ImportError) else None
        if cause is not None and cause.name:
            return f"{cause.name} is not installed"
        return " ".join(str(e).split())
    return None


def reward_threshold(env_id: str) -> float | None:
    """The env's registered ``reward_threshold`` (e.g. 475 for CartPole-v1), if any."""
    _register_optional()
    return gym.spec(env_id).reward_threshold


STANDARD_EPISODES = 100   # Gym's definition of solving its classic tasks: a mean over 100 episodes
OTHER_EPISODES = 20       # our stated number where the env defines none (Atari, MuJoCo, yours)


def solved_episodes(env_id: str) -> int:
    """Episodes a confirming evaluation averages before a run on ``env_id`` is called solved:
    100 for classic-control and Box2D tasks (Gym defines e.g. CartPole-v1 as solved at a mean of
    475 over 100 consecutive episodes), :data:`OTHER_EPISODES` for envs without a standard."""
    _register_optional()
    entry = gym.spec(env_id).entry_point
    name = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    if name.startswith(("gymnasium.envs.classic_control", "gymnasium.envs.box2d")):
        return STANDARD_EPISODES
    return OTHER_EPISODES


def _make_one(cfg: EnvConfig, training: bool) -> gym.Env:
    if is_atari(cfg.id):
        from dask_rl.envs.atari import make_atari

        return make_atari(cfg, training=training)
    env = gym.make(cfg.id, **cfg.kwargs)
    return gym.wrappers.RecordEpisodeStatistics(env)


def make_env(cfg: EnvConfig, *, training: bool = False) -> gym.Env:
    """One environment (not vectorised), wrapped as for evaluation; the caller seeds resets."""
    _register_optional()
    return _make_one(cfg, training)


def make_vector_env(cfg: EnvConfig, num_envs: int | None = None, *, seed: int,
                    training: bool = True) -> SyncVectorEnv:
    """A reset, seeded vector env of ``num_envs`` copies (default ``cfg.num_envs``).

    Sub-env ``i`` is seeded with ``seed + i``; the caller keeps the returned first observation
    from ``env.reset`` (stored as ``env.first_obs``).
    """
    _register_optional()
    n = num_envs or cfg.num_envs
    env = SyncVectorEnv([functools.partial(_make_one, cfg, training) for _ in range(n)],
                        autoreset_mode=AutoresetMode.SAME_STEP)
    obs, _ = env.reset(seed=[seed + i for i in range(n)])
    env.action_space.seed(seed)
    env.first_obs = obs
    return env


def env_spaces(cfg: EnvConfig) -> tuple[gym.Space, gym.Space]:
    """Single-env observation and action spaces, as the model sees them."""
    env = make_vector_env(cfg, 1, seed=0)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def episode_stats(info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of the episodes that ended in this vector step."""
    final = info.get("final_info")
    if not final or "episode" not in final:
        return np.zeros(0, np.float64), np.zeros(0, np.int64)
    mask = final["_episode"]
    ep = final["episode"]
    return np.asarray(ep["r"])[mask].astype(np.float64), np.asarray(ep["l"])[mask].astype(np.int64)
