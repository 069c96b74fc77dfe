"""A corridor: walk right to the goal. Small enough that PPO learns it in a few thousand steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Corridor(gym.Env):
    """Start at cell 0 of ``length`` cells; actions 0 (left) and 1 (right); reaching the last
    cell ends the episode with reward 1; every step costs 0.01; ``max_steps`` truncates.
    Observation: the one-hot position."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, length: int = 6, max_steps: int = 30, render_mode: str | None = None):
        self.length, self.max_steps, self.render_mode = length, max_steps, render_mode
        self.observation_space = spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.pos = self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.pos = int(np.clip(self.pos + (1 if int(action) == 1 else -1), 0, self.length - 1))
        terminated = self.pos == self.length - 1
        reward = (1.0 if terminated else 0.0) - 0.01
        return self._obs(), reward, terminated, self.t >= self.max_steps, {}

    def render(self):
        frame = np.zeros((16, 16 * self.length, 3), np.uint8)
        frame[:, 16 * self.pos:16 * (self.pos + 1)] = 255
        return frame


class DictCorridor(Corridor):
    """The corridor with a Dict observation (position as Discrete, time left as Box) and a
    MultiDiscrete action: (direction, a second component that does nothing)."""

    def __init__(self, length: int = 6, max_steps: int = 30):
        super().__init__(length, max_steps)
        self.observation_space = spaces.Dict({
            "pos": spaces.Discrete(length),
            "left": spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.action_space = spaces.MultiDiscrete([2, 3])

    def _obs(self):
        return {"pos": self.pos,
                "left": np.array([1.0 - self.t / self.max_steps], np.float32)}

    def step(self, action):
        return super().step(int(np.asarray(action)[0]))


def make_corridor(length: int = 6, max_steps: int = 30) -> gym.Env:
    """An entry point: a function that makes the environment."""
    return Corridor(length=length, max_steps=max_steps)


class BrokenStep(Corridor):
    """Its step returns the old Gym API's 4 values."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info
