"""Zarr checkpoints: the only package that imports ``zarr``."""

from dask_rl.checkpoint.location import STORE_FILE, StoreLocation, StoreLocationError
from dask_rl.checkpoint.store import (
                                      FORMAT_VERSION,
                                      CheckpointError,
                                      CheckpointStore,
                                      Pending,
                                      read_trajectory,
                                      write_trajectory,
)

__all__ = ["FORMAT_VERSION", "STORE_FILE", "CheckpointError", "CheckpointStore", "Pending",
           "StoreLocation", "StoreLocationError", "read_trajectory", "write_trajectory"]
