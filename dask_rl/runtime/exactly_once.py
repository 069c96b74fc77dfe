"""Exactly-once pushes to a parameter actor.

A push names its run, the actor's *epoch* (a token drawn when that actor was created) and its
task's sequence number. A sequence number seen before (a learner task re-run by Dask after its
worker died having already pushed, a retried task), another run's push and a push from
another epoch (a lost actor's learner) are refused and counted, never applied. The sequence
numbers seen are part of the checkpoint, so a re-created actor refuses exactly what its
checkpoint already holds.
"""

from __future__ import annotations

import numpy as np


class ExactlyOnce:
    """The pushes one actor has taken, and why it refuses one."""

    def __init__(self, run: str | None, epoch: str | None):
        self.run, self.epoch = run, epoch
        self.seen: set[int] = set()   # sequence numbers of the pushes taken

    def refusal(self, seq: int | None, epoch: str | None, run: str | None) -> str | None:
        """Why a push must not be applied, or None (it may)."""
        if run is not None and self.run is not None and run != self.run:
            return f"it belongs to run {run!r}, this actor to {self.run!r}"
        if epoch is not None and self.epoch is not None and epoch != self.epoch:
            return f"it was meant for the actor of epoch {epoch}, this is {self.epoch}"
        if seq is not None and int(seq) in self.seen:
            return f"push {seq} was already taken"
        return None

    def taken(self, seq: int | None) -> None:
        if seq is not None:
            self.seen.add(int(seq))

    def __len__(self) -> int:
        return len(self.seen)

    def state(self) -> np.ndarray:
        return np.fromiter(sorted(self.seen), np.int64, len(self.seen))

    def load_state(self, seen) -> None:
        self.seen = {int(s) for s in np.asarray(seen, np.int64)}
