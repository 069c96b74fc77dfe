"""An off-policy run's replay buffer in its checkpoints, written and read by the workers that
hold it (never through the driver).

Two buffers can be in a run: IMPACT's trajectories with their remaining uses
(:class:`~dask_rl.control.replay.TrajectoryReplay`) and a replay algorithm's sampled buffer with
each trajectory's shape (:class:`~dask_rl.runtime.sampled.SampledReplay`). A checkpoint with
a buffer is published only when every worker's write was looked at and succeeded
(``Checkpoints.write`` keeps the previous one latest otherwise); each read checks its
checksum.
"""

from __future__ import annotations

from typing import Any

from distributed import Future

from dask_rl.checkpoint import Pending
from dask_rl.runtime.tasks import read_replay_task, write_replay_task

REPLAY_WRITE_TIMEOUT_S = 120.0  # a checkpoint's replay writes unfinished by then: not published


class ReplayCheckpoint:
    """Writes the driver's replay buffer into a pending checkpoint, and restores it."""

    def __init__(self, driver: Any):
        self.driver = driver

    def write(self, pending: Pending) -> tuple[list[dict[str, int]], dict]:
        """The workers' writes (their checksums) and the buffer's bookkeeping for the
        checkpoint's metadata; nothing when the pipeline keeps no buffer."""
        d = self.driver
        if not d.cfg.checkpoint.replay_buffer:
            return [], {}
        if d.replay is not None:
            kept = [(fut, uses) for fut, uses in d.replay.items() if fut.status == "finished"]
            key = "replay_uses"
        elif d.sampled is not None:
            kept = [(fut, [steps, envs]) for fut, steps, envs in d.sampled.buffer.items()
                    if fut.status == "finished"]
            key = "replay_shapes"
        else:
            return [], {}
        if not kept:
            return [], {}
        writes = [d.client.submit(write_replay_task, pending.url, i, fut, pure=False,
                                  retries=0) for i, (fut, _) in enumerate(kept)]
        try:
            # Every write is looked at: one that raised, whose worker died inside it, or that
            # has not finished in time fails this checkpoint.
            d.wait_all(writes, REPLAY_WRITE_TIMEOUT_S)   # TimeoutError if one is not done
            written = [w.result() for w in writes]
        finally:
            d.client.cancel(writes)
        return written, {key: [extra for _, extra in kept]}

    def restore(self, url: str, meta: dict) -> None:
        """Reload a checkpoint's buffer onto the workers."""
        d = self.driver
        count = meta.get("replay", 0)
        checksums = meta.get("replay_checksums") or [None] * count

        def read(i: int) -> Future:
            return d.client.submit(read_replay_task, url, i, checksums[i], pure=False)

        if d.replay is not None:
            uses = meta.get("replay_uses", [])[:count]
            d.replay.restore([(read(i), n) for i, n in enumerate(uses)])
        elif d.sampled is not None:
            shapes = meta.get("replay_shapes", [])[:count]
            d.sampled.buffer.restore([(read(i), s, e) for i, (s, e) in enumerate(shapes)])
            d.replay_changed()
