"""Pure asynchronous aggregation: every gradient is applied the moment it arrives.

The fastest and least careful baseline (Hogwild-style parameter server): no waiting, no
staleness correction, weight 1.
"""

from __future__ import annotations

from dask_rl.staleness.base import Decision, Strategy


class Async(Strategy):
    name = "async"

    def decide(self) -> Decision:
        if not self.buffer:
            return Decision()
        # At most one gradient is buffered here: each is applied on arrival.
        return self._aggregate({i: 1.0 for i in self.buffer})
