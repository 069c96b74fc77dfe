"""A driver's periodic duties, in one table: each runs at most once per its period."""

from __future__ import annotations

import time
from typing import Callable


class Timers:
    """``(period_s, duty)`` pairs, run in order by :meth:`run` when due (period 0: every
    pass, for duties that keep their own cadence). ``first_after`` delays a duty's first
    run by its period (a run's first seconds have nothing to follow yet)."""

    def __init__(self, duties: list[tuple[float, Callable[[], None]]], *,
                 first_after: tuple[Callable[[], None], ...] = ()):
        now = time.monotonic()
        self.duties = [(period, duty, now if duty in first_after else -float("inf"))
                       for period, duty in duties]

    def run(self) -> None:
        now = time.monotonic()
        for i, (period, duty, last) in enumerate(self.duties):
            if now - last >= period:
                self.duties[i] = (period, duty, now)
                duty()
