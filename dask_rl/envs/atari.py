"""Atari preprocessing (Mnih et al. 2015; Machado et al. 2018) over ale-py.

84x84 grayscale, max-pooled frame skip 4, up to ``noop_max`` random no-ops at reset, frames
stacked along the first axis and kept as uint8. With ``episodic_life`` a lost life ends the
*training* episode without resetting the game; true game returns are recorded before that
wrapper. Reward clipping happens in the learner's loss, so trajectories keep raw rewards.
"""

from __future__ import annotations

import gymnasium as gym

from dask_rl.config.schema import EnvConfig


class EpisodicLife(gym.Wrapper):
    """Report a lost life as ``terminated``; reset the game only when it is really over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            # A no-op step continues the game from the lost life.
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        self.game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after reset for games that wait for it (Breakout); harmless elsewhere."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def make_atari(cfg: EnvConfig, training: bool = True) -> gym.Env:
    import ale_py

    _one_opencv_thread()
    gym.register_envs(ale_py)
    kwargs = {"frameskip": 1, **cfg.kwargs}
    env = gym.make(cfg.id, **kwargs)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=cfg.noop_max, frame_skip=4,
                                          screen_size=84, grayscale_obs=True,
                                          terminal_on_life_loss=False, scale_obs=False)
    if training and cfg.episodic_life:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = gym.wrappers.FrameStackObservation(env, cfg.frame_stack)
    return env


def _one_opencv_thread() -> None:
    """OpenCV resizes frames on a thread pool of its own; rollouts parallelise across workers,
    so one thread each (otherwise a worker's frames compete with its neighbours' cores)."""
    try:
        import cv2
    except ImportError:
        return
    cv2.setNumThreads(1)
