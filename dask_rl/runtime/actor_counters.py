"""What the parameter actor counts across its incarnations: checkpointed with its state."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Counters:
    """What the actor counts across its incarnations (checkpointed, flat in its state)."""

    rejected: int = 0          # gradients never applied: non-finite, wrong shape
    refused: int = 0           # pushes refused: repeats, another epoch's or run's
    weight_sum: float = 0.0    # of the applied gradients' weights: the effective step's measure
    pulls_sent: int = 0        # pulls answered with parameters
    pulls_unchanged: int = 0   # pulls answered with nothing (not moved, or not enough)
    rollout_pulls: int = 0     # of all pulls, those of rollout slots ...
    rollout_loads: int = 0     # ... and those of them answered with parameters

    def state(self) -> dict[str, int | float]:  # noqa: D102
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "Counters":
        """From a checkpoint's state; a counter it lacks (an older checkpoint) starts at 0."""
        return cls(**{f.name: type(f.default)(state.get(f.name, f.default))
                      for f in dataclasses.fields(cls)})
