"""IMPACT's circular replay buffer (Luo et al., ICLR'20, Sec. 3.2), over trajectory handles.

The buffer keeps the ``capacity`` newest trajectories and lets each be learned from at most
``replay`` times in all (its first use included). It holds *handles* — Dask futures in the
driver, anything in tests — never the data, which stays on the worker that collected it.

Examples
--------
>>> buffer = TrajectoryReplay(replay=2, capacity=8)
>>> buffer.add("t1")          # learned once, as it arrived
>>> buffer.next()             # its one replay
't1'
>>> buffer.next() is None     # spent
True
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

T = TypeVar("T")


class TrajectoryReplay(Generic[T]):
    """Handles of recent trajectories and the times each was learned from, newest last."""

    def __init__(self, *, replay: int, capacity: int):
        if replay < 1 or capacity < 1:
            raise ValueError(f"replay and capacity must be >= 1, got {replay}, {capacity}")
        self.replay = replay
        self.entries: collections.deque[list] = collections.deque(maxlen=capacity)

    def add(self, handle: T) -> None:
        """A trajectory was just learned from for the first time."""
        if self.replay > 1:
            self.entries.append([handle, 1])

    def next(self) -> T | None:
        """The newest trajectory still owed a replay (its use is counted), or None."""
        for entry in reversed(self.entries):
            entry[1] += 1
            if entry[1] >= self.replay:
                self.entries.remove(entry)
            return entry[0]
        return None

    def items(self) -> list[tuple[T, int]]:
        """``(handle, times learned)`` of every trajectory kept, oldest first."""
        return [(h, uses) for h, uses in self.entries]

    def restore(self, items: list[tuple[T, int]]) -> None:
        """Replace the contents (from a checkpoint), oldest first."""
        self.entries.clear()
        for handle, uses in items:
            if uses < self.replay:
                self.entries.append([handle, int(uses)])

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)
