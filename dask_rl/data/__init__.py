"""Plain data shared by every layer: trajectories, typed results, summaries, metrics records."""

from dask_rl.data.results import (
                                  ESStep,
                                  Evaluation,
                                  LearnerReport,
                                  LearnerUpdate,
                                  PerturbationResult,
                                  PolicySnapshot,
                                  Progress,
                                  PushAck,
                                  TrajectoryStats,
)
from dask_rl.data.trajectory import Trajectory

__all__ = ["ESStep", "Evaluation", "LearnerReport", "LearnerUpdate", "PerturbationResult",
           "PolicySnapshot", "Progress", "PushAck", "Trajectory", "TrajectoryStats"]
