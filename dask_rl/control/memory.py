"""Will one rollout task fit a worker? A lower-bound estimate, checked before a run starts.

A rollout task holds ``env.num_envs`` environments and the trajectory it collects:
``num_envs x (rollout.steps + 1)`` observations plus a few float32 scalars per step (action,
log-probability, value, reward, done, ...). Its learner holds the trajectory again (as a torch
batch). Environments themselves cost at least :data:`ENV_BYTES` each (rough lower bounds:
classic control holds a few arrays; an Atari emulator with its frame buffers several MiB;
a MuJoCo model and data about a MiB). The estimate is deliberately low: it only refuses sizes
that cannot fit (``env.num_envs=1e9``), never borderline ones.
"""

from __future__ import annotations

import numpy as np

from dask_rl.config import ConfigError

ENV_BYTES = {"atari": 8 << 20, "mujoco": 1 << 20, None: 16 << 10}
SCALARS_PER_STEP = 8  # action, log-probability, value, reward, done, truncated, ...


def rollout_bytes(num_envs: int, steps: int, obs_shape: tuple[int, ...], obs_itemsize: int,
                  family: str | None) -> int:
    """Bytes one rollout task and its learner need, at least."""
    per_step = int(np.prod(obs_shape)) * obs_itemsize + 4 * SCALARS_PER_STEP
    trajectory = num_envs * (steps + 1) * per_step
    return 2 * trajectory + num_envs * ENV_BYTES.get(family, ENV_BYTES[None])


def check_fits(need: int, worker_bytes: int | None, *, num_envs: int, steps: int) -> None:
    """:class:`ConfigError` when one rollout task needs more than a worker's memory."""
    if not worker_bytes or need <= worker_bytes:
        return
    raise ConfigError(
        f"env.num_envs={num_envs} x rollout.steps={steps}: one rollout task needs at least "
        f"{need / 2**30:.1f} GiB, a worker has {worker_bytes / 2**30:.1f} GiB; use fewer "
        f"environments or steps per task")
