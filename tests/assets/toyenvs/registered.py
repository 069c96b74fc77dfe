"""Importing this module registers ``Corridor-v0`` (``env.id: toyenvs.registered:Corridor-v0``)."""

import gymnasium as gym

if "Corridor-v0" not in gym.registry:
    gym.register("Corridor-v0", entry_point="toyenvs.corridor:Corridor", max_episode_steps=30,
                 kwargs={"length": 6})
