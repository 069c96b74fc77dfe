"""Replay buffers over trajectory handles, and TianJi's sample-staleness control.

:class:`TrajectoryReplay` is IMPACT's circular replay buffer (Luo et al., ICLR'20, Sec. 3.2):
whole trajectories replayed by learners. :class:`TransitionReplay` is TianJi's buffer of
``N_s`` transitions that value-based learners sample batches from, and
:class:`SampleStaleness` keeps its ratio ``P = B_s / N_s`` under a tolerance.

IMPACT's buffer keeps the ``capacity`` newest trajectories and lets each be learned from at most
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
import math
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

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


class TransitionReplay(Generic[T]):
    """TianJi's replay buffer of ``N_s`` transitions, over trajectory handles (the data stays
    on the worker that collected it): the newest trajectories up to ``capacity`` transitions,
    sampled uniformly over transitions.

    Examples
    --------
    >>> buffer = TransitionReplay(capacity=1_000)
    >>> buffer.add("t1", steps=128, envs=4)   # 512 transitions
    []
    >>> plan = buffer.sample(64, np.random.default_rng(0))   # {"t1": (t, i)}
    """

    def __init__(self, *, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.entries: collections.deque[tuple[T, int, int]] = collections.deque()
        self.size = 0

    def add(self, handle: T, *, steps: int, envs: int) -> list[T]:
        """Keep a trajectory of ``steps`` x ``envs`` transitions; returns the handles evicted
        to stay within the capacity (the oldest; the newest one always stays)."""
        self.entries.append((handle, steps, envs))
        self.size += steps * envs
        evicted = []
        while self.size > self.capacity and len(self.entries) > 1:
            old, s, e = self.entries.popleft()
            self.size -= s * e
            evicted.append(old)
        return evicted

    def sample(self, count: int,
               rng: np.random.Generator) -> dict[T, tuple[np.ndarray, np.ndarray]]:
        """``count`` transitions drawn uniformly (with replacement): per handle, the step and
        env indices ``(t, i)`` of its draws."""
        if not self.entries:
            raise ValueError("the replay buffer is empty")
        sizes = np.array([s * e for _, s, e in self.entries])
        draws = rng.integers(0, self.size, count)
        which = np.searchsorted(np.cumsum(sizes), draws, side="right")
        offset = draws - (np.cumsum(sizes) - sizes)[which]
        plan: dict[T, tuple[np.ndarray, np.ndarray]] = {}
        for k in np.unique(which):
            handle, _, envs = self.entries[int(k)]
            local = offset[which == k]
            plan[handle] = (local // envs, local % envs)
        return plan

    def items(self) -> list[tuple[T, int, int]]:
        """``(handle, steps, envs)`` of every trajectory kept, oldest first."""
        return list(self.entries)

    def restore(self, items: list[tuple[T, int, int]]) -> None:
        """Replace the contents (from a checkpoint), oldest first. Nothing is evicted: the
        checkpoint held what fitted the capacity then, which sample-staleness control may have
        grown past the configured one (the grown capacity is restored with the driver's state,
        possibly after this)."""
        self.clear()
        for handle, steps, envs in items:
            self.entries.append((handle, steps, envs))
            self.size += steps * envs
        self.capacity = max(self.capacity, self.size)

    def clear(self) -> None:
        self.entries.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self.entries)


@dataclass
class SampleStaleness:
    """TianJi's sample-staleness control (notes, Sec. 2.3.1 and 3.2): the ratio
    ``P = B_s / N_s`` of the batch a gradient step draws to the transitions the buffer holds is
    kept at or under ``tolerance``, and the learning rate follows ``alpha / (1 + lambda P)``.

    Above the tolerance the controller first **grows** ``N_s`` (the buffer's capacity, up to
    ``max_capacity``) and only once the buffer is full at that cap **shrinks** ``B_s`` (down
    to ``min_batch``). Growing keeps the gradient's batch, hence its variance and the
    learner's efficiency per step, and costs worker memory, which the cap bounds; a smaller
    batch is noisier per step. While the buffer is still filling towards a capacity large
    enough, ``P`` falls by itself and nothing changes.

    The buffer holds whole trajectories of ``chunk`` transitions, so a grown capacity is
    rounded up to a whole number of them, and the buffer is *full* when one more trajectory
    would not fit (it never holds more than ``capacity``, usually a little less).

    Deviation from the notes: ``B_s`` is never *enlarged* when ``P`` is small (TianJi's tuning
    guide enlarges the batch below 0.1); :meth:`rule` names that advice for the records.
    """

    batch: int               # B_s
    capacity: int            # N_s's bound
    tolerance: float
    max_capacity: int
    min_batch: int
    chunk: int = 1           # transitions per trajectory
    lam: float = 1.0

    def ratio(self, held: int) -> float:
        """``P``, measured against the transitions the buffer holds now, not its capacity:
        while the buffer fills, a batch is a larger share of what can be sampled, and that
        share is what makes samples repeat (stale)."""
        return self.batch / max(held, 1)

    def learning_rate(self, alpha: float, held: int) -> float:
        """``alpha / (1 + lambda P)``."""
        return alpha / (1.0 + self.lam * self.ratio(held))

    def full(self, held: int) -> bool:
        """No further trajectory fits without evicting one."""
        return held + self.chunk > self.capacity

    def control(self, held: int) -> str | None:
        """Act on ``P``: ``"grow_buffer"``, ``"shrink_batch"`` or None."""
        if self.ratio(held) <= self.tolerance:
            return None
        need = math.ceil(self.batch / self.tolerance)
        need = math.ceil(need / self.chunk) * self.chunk   # whole trajectories
        if self.capacity < need and self.capacity < self.max_capacity:
            self.capacity = min(self.max_capacity, need)
            return "grow_buffer"
        if self.full(held) and self.batch > self.min_batch:
            self.batch = max(self.min_batch, math.floor(self.tolerance * held))
            return "shrink_batch"
        return None

    def rule(self, held: int) -> str | None:
        """TianJi's tuning advice for the current ``P`` (:func:`~dask_rl.control.allocation.
        operating_rule`): "more_learners" above 0.3, "larger_batch" below 0.1.

        Recorded for comparison only: with ``P = B_s / N_s`` the number of learners does not
        move ``P`` (each learner's consumption is ``updates_per_task x B_s``, and reuse is set
        by the replay ratio), so the controller acts on ``N_s`` and ``B_s`` instead."""
        from dask_rl.control.allocation import operating_rule

        return operating_rule(self.ratio(held))
