"""Environment factory: Gymnasium ids (or your own entry points) to seeded vector environments.

Every vector env made here autoresets in the *same step* (an episode's last transition returns
the first observation of the next episode, the final observation sits in ``info["final_obs"]``),
so every stored transition is a real one, and records true episode returns before any wrapper
that changes rewards or episode ends (Atari's episodic life).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs import registration
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from dask_rl.config.schema import EnvConfig, entry_point_text

__all__ = ["make_env", "code_named_by", "make_vector_env", "env_spaces", "check_env",
           "env_family", "is_atari", "reward_threshold", "solved_episodes", "episode_stats",
           "space_to_dict", "space_from_dict"]


@functools.lru_cache(maxsize=None)
def _register_optional() -> None:
    try:
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:
        pass


def _spec(env_id: str) -> registration.EnvSpec:
    """The registration of ``env_id``; ``module:id`` imports ``module`` first (Gymnasium's form
    for environments a package registers when imported). Raises ``gym.error.Error`` or
    ``ImportError``."""
    _register_optional()
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return gym.spec(name)


def _registered(env_id: str) -> registration.EnvSpec | None:
    try:
        return _spec(env_id)
    except (gym.error.Error, ImportError):
        return None


def is_atari(env: EnvConfig) -> bool:
    """True for Arcade Learning Environment ids (``ALE/Pong-v5``, ``PongNoFrameskip-v4``)."""
    if env.entry_point is not None:
        return False
    spec = _registered(env.id)
    if spec is None:
        return env.id.startswith("ALE/")
    return "ale_py" in str(spec.entry_point)


#: Environment families whose dependencies come with an extra of dask-rl (pyproject.toml).
EXTRAS = {"atari": "Atari", "mujoco": "MuJoCo"}


def env_family(env: EnvConfig) -> str | None:
    """``atari``, ``mujoco`` or None (classic control, other Gymnasium environments, yours)."""
    if is_atari(env):
        return "atari"
    spec = _registered(env.id) if env.entry_point is None else None
    return "mujoco" if spec is not None and "mujoco" in str(spec.entry_point) else None


def check_env(env: EnvConfig, *, discrete_actions: bool = False) -> str | None:
    """None if ``env`` can be made and trained here, else a one-line reason (said before any
    cluster starts).

    A Gymnasium id: its module is imported (not only its registration looked up), so a missing
    dependency is found here, and the reason names the extra that installs it, e.g.
    ``pip install 'dask-rl[mujoco]'``. Your environment (``module:id`` or ``entry_point``): its
    code is imported, one environment is made, reset and stepped once, and its spaces are
    checked (observations: Box, or Discrete/MultiDiscrete/MultiBinary/Dict/Tuple, flattened
    to a vector; actions: Box, Discrete, MultiDiscrete; only Discrete with
    ``discrete_actions``, for value-based algorithms).
    """
    if env.entry_point is not None:
        problem = _creator_problem(env.entry_point)
        return problem or _round_trip(env, discrete_actions)
    _register_optional()
    module = env.id.rpartition(":")[0]
    try:
        spec = _spec(env.id)
    except ImportError as e:
        return f"cannot import {module} ({_one_line(e)})"
    except gym.error.Error:
        if module:
            return f"importing {module} does not register {env.id.rpartition(':')[2]!r}"
        if env.id.startswith("ALE/") or "NoFrameskip" in env.id:
            return _needs_extra("atari", "ale_py is not installed")
        return "unknown Gymnasium environment id"
    kind = env_family(env)
    missing = _missing_module(spec.entry_point, kind)
    if missing is not None:
        if kind is None:
            return f"this environment needs a module that is not installed ({missing})"
        return _needs_extra(kind, missing)
    if module or discrete_actions:  # yours, or an algorithm that needs Discrete actions
        return _round_trip(env, discrete_actions)
    return None


def code_named_by(env: EnvConfig) -> str | None:
    """What code ``env`` names beyond Gymnasium's registry, as text (``"entry_point
    subprocess:run"``), or None when it is an id already registered here, whose maker
    comes with an installed package and is not named by ``env`` itself.

    A checkpoint's config is data written by whoever wrote the checkpoint: ``evaluate``,
    ``export`` and ``load_policy`` make its environment only when this is None, or when the
    user vouches for it (their own pipeline, or a trust flag). Nothing is imported here.
    """
    if env.entry_point is not None:
        return f"entry_point {entry_point_text(env.entry_point)}"
    if env.id is None or ":" in env.id:
        return f"id {env.id!r} (imports its module)"
    _register_optional()
    if env.id not in gym.registry:
        return f"id {env.id!r}, which nothing installed here registers"
    return None


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def _creator(entry_point: Any) -> Callable[..., Any]:
    """The function or class an entry point names (or is)."""
    if callable(entry_point):
        return entry_point
    return registration.load_env_creator(entry_point)


def _creator_problem(entry_point: Any) -> str | None:
    if callable(entry_point):
        return None
    module, sep, attr = str(entry_point).partition(":")
    if not sep or not module or not attr:
        return "expected module:name, e.g. my_pkg.envs:make_env"
    try:
        importlib.import_module(module)
    except ImportError as e:
        return f"cannot import {module} ({_one_line(e)})"
    except Exception as e:  # the module itself fails to import
        return f"importing {module} failed ({_one_line(e)})"
    try:
        _creator(entry_point)
    except (AttributeError, ValueError):
        if module == "__main__":   # a run trained with a class from a script or notebook
            return (f"{attr!r} was defined in a script or notebook (__main__), which this "
                    f"process is not; move it into a module and give module:name")
        return f"{module} has no {attr!r}"
    return None


OBS_FLATTENED = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Dict,
                 spaces.Tuple)
ACTIONS = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete)


def _round_trip(env: EnvConfig, discrete_actions: bool) -> str | None:
    """Make one environment, check its spaces, reset and step it once (before any wrapper of
    ours, so that the env's own API is what is checked); a one-line reason if anything fails."""
    try:
        made = _make_raw(env, training=True)
    except Exception as e:
        return f"making the environment failed ({_one_line(e)})"
    try:
        obs_space, act_space = _wrap(made).observation_space, made.action_space
        if not isinstance(obs_space, spaces.Box):
            return (f"observation space {made.observation_space} is not supported (Box, or "
                    f"one of {', '.join(t.__name__ for t in OBS_FLATTENED)}, flattened)")
        if not isinstance(act_space, ACTIONS):
            return (f"action space {act_space} is not supported (dask-rl acts in Box, "
                    f"Discrete and MultiDiscrete spaces)")
        if isinstance(act_space, spaces.Box) and len(act_space.shape) != 1:
            return f"action space {act_space}: a Box of actions must be 1-D"
        if len(obs_space.shape) == 3 and obs_space.dtype == np.uint8 and not (
                obs_space.shape[0] <= 16 and min(obs_space.shape[1:]) >= 36):
            return (f"observation space {obs_space}: image observations go to the Nature CNN "
                    f"channels first, (C, H, W) with C <= 16 and H, W >= 36 (e.g. Gymnasium's "
                    f"ResizeObservation and a transpose of HWC frames)")
        if discrete_actions and not isinstance(act_space, spaces.Discrete):
            return f"action space {act_space}: this algorithm needs Discrete actions"
        if np.any(getattr(act_space, "start", 0) != 0):
            return f"action space {act_space}: only a start of 0 is supported"
        if isinstance(act_space, spaces.MultiDiscrete) and act_space.nvec.ndim != 1:
            return f"action space {act_space}: only a 1-D MultiDiscrete is supported"
        out = made.reset(seed=0)
        if not (isinstance(out, tuple) and len(out) == 2):
            return "reset() must return (obs, info), Gymnasium's API"
        obs = out[0]
        if isinstance(made.observation_space, spaces.Box):
            obs = np.asarray(obs)
            if obs.shape != made.observation_space.shape:
                return (f"reset() returned an observation of shape {obs.shape}, the space "
                        f"says {made.observation_space.shape}")
            obs = obs.astype(made.observation_space.dtype)  # float64 for float32 is fine
        if not made.observation_space.contains(obs):
            return (f"reset() returned an observation outside the observation space "
                    f"{made.observation_space}")
        act_space.seed(0)
        out = made.step(act_space.sample())
        if not (isinstance(out, tuple) and len(out) == 5):
            n = len(out) if isinstance(out, tuple) else type(out).__name__
            return (f"step() returned {n} values; Gymnasium's API returns 5 (obs, reward, "
                    f"terminated, truncated, info)")
        if np.ndim(out[1]) != 0 or not np.isfinite(float(out[1])):
            return f"step() returned a reward that is not a finite number: {out[1]!r}"
    except Exception as e:
        return f"reset/step failed ({_one_line(e)})"
    finally:
        try:
            made.close()
        except Exception:
            pass
    return None


def _needs_extra(kind: str, missing: str) -> str:
    return (f"{EXTRAS[kind]} environments need the '{kind}' extra: "
            f"pip install 'dask-rl[{kind}]' ({missing})")


def _missing_module(entry_point: Any, kind: str | None) -> str | None:
    """What the environment's code cannot import, as a short phrase, if anything."""
    try:
        if isinstance(entry_point, str):
            registration.load_env_creator(entry_point)
        if kind == "atari":  # Gymnasium's Atari preprocessing resizes frames with OpenCV
            importlib.import_module("cv2")
    except ImportError as e:
        return f"{e.name} is not installed" if e.name else " ".join(str(e).split())
    except gym.error.DependencyNotInstalled as e:
        cause = e.__cause__ if isinstance(e.__cause__, ImportError) else None
        if cause is not None and cause.name:
            return f"{cause.name} is not installed"
        return " ".join(str(e).split())
    return None


def reward_threshold(env: EnvConfig) -> float | None:
    """The env's registered ``reward_threshold`` (e.g. 475 for CartPole-v1), if any."""
    spec = _registered(env.id) if env.entry_point is None else None
    return spec.reward_threshold if spec is not None else None


STANDARD_EPISODES = 100   # Gym's definition of solving its classic tasks: a mean over 100 episodes
OTHER_EPISODES = 20       # our stated number where the env defines none (Atari, MuJoCo, yours)


def solved_episodes(env: EnvConfig) -> int:
    """Episodes of the env's standard evaluation, the one a solved run must be predicted to
    pass (its confirmation is :data:`~dask_rl.control.schedule.CONFIRM_FACTOR` times as long):
    100 for classic-control and Box2D tasks (Gym defines e.g. CartPole-v1 as solved at a mean of
    475 over 100 consecutive episodes), :data:`OTHER_EPISODES` for envs without a standard."""
    spec = _registered(env.id) if env.entry_point is None else None
    entry = spec.entry_point if spec is not None else ""
    name = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    if name.startswith(("gymnasium.envs.classic_control", "gymnasium.envs.box2d")):
        return STANDARD_EPISODES
    return OTHER_EPISODES


def _make_raw(cfg: EnvConfig, training: bool) -> gym.Env:
    """The environment as its maker returns it (Atari: with its preprocessing)."""
    if cfg.entry_point is not None:
        env = _creator(cfg.entry_point)(**cfg.kwargs)
        if not isinstance(env, gym.Env):
            raise TypeError(f"env.entry_point {cfg.name} returned {type(env).__name__}, "
                            f"not a gymnasium.Env")
        return env
    if is_atari(cfg):
        from dask_rl.envs.atari import make_atari

        return make_atari(cfg, training=training)
    return gym.make(cfg.id, **cfg.kwargs)


def _wrap(env: gym.Env) -> gym.Env:
    """Observations other than a Box become a float32 vector (Gymnasium's own flattening)."""
    if isinstance(env.observation_space, OBS_FLATTENED):
        env = gym.wrappers.FlattenObservation(env)
        if env.observation_space.dtype != np.float32:  # one-hot parts make it int64/float64
            env = gym.wrappers.DtypeObservation(env, np.float32)
    return env


def _make_one(cfg: EnvConfig, training: bool) -> gym.Env:
    env = _make_raw(cfg, training)
    if is_atari(cfg):  # make_atari records episode statistics before its reward wrappers
        return env
    return gym.wrappers.RecordEpisodeStatistics(_wrap(env))


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


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """A JSON description of a Box, Discrete or MultiDiscrete space (kept in checkpoints, so
    that a trained policy loads without its environment)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, spaces.Box):
        def bound(b: np.ndarray) -> Any:  # one number when uniform (Atari: 0 and 255)
            return b.flat[0].item() if b.size and np.all(b == b.flat[0]) else b.tolist()
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": bound(space.low), "high": bound(space.high)}
    raise ValueError(f"cannot describe the space {space}")


def space_from_dict(d: dict[str, Any]) -> gym.Space:
    """The space :func:`space_to_dict` described."""
    if d["type"] == "Discrete":
        return spaces.Discrete(d["n"], start=d.get("start", 0))
    if d["type"] == "MultiDiscrete":
        return spaces.MultiDiscrete(d["nvec"])
    dtype = np.dtype(d["dtype"])
    shape = tuple(d["shape"])
    return spaces.Box(np.broadcast_to(np.asarray(d["low"], dtype), shape),
                      np.broadcast_to(np.asarray(d["high"], dtype), shape), shape, dtype)


def episode_stats(info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of the episodes that ended in this vector step."""
    final = info.get("final_info")
    if not final or "episode" not in final:
        return np.zeros(0, np.float64), np.zeros(0, np.int64)
    mask = final["_episode"]
    ep = final["episode"]
    return np.asarray(ep["r"])[mask].astype(np.float64), np.asarray(ep["l"])[mask].astype(np.int64)
