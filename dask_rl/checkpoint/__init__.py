"""Zarr checkpoints: the only package that imports ``zarr``."""

from dask_rl.checkpoint.store import (
                                      FORMAT_VERSION,
                                      CheckpointError,
                                      CheckpointStore,
                                      Pending,
                                      read_trajectory,
                                      write_trajectory,
)

__all__ = ["FORMAT_VERSION", "CheckpointError", "CheckpointStore", "Pending", "read_trajectory",
           "write_trajectory"]
