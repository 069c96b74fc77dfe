"""Clients for the ``cluster:`` section: an embedded LocalCluster or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from distributed import Client, LocalCluster

from dask_rl.config import ClusterConfig

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def connect(cfg: ClusterConfig, *, address: str | None = None,
            n_workers: int | None = None) -> Iterator[Client]:
    """A client for this pipeline's cluster, closed (with any cluster it started) on exit.

    ``address`` (the CLI's ``--address``) overrides the section and connects to a running
    scheduler; ``n_workers`` (``--workers``) overrides ``cluster.n_workers``.
    """
    address = address or (cfg.address if cfg.kind == "address" else None)
    if address:
        with Client(address) as client:
            yield client
        return
    cluster = LocalCluster(
        n_workers=n_workers or cfg.n_workers,
        threads_per_worker=cfg.threads_per_worker,
        processes=cfg.processes,
        memory_limit=cfg.memory_limit,
        dashboard_address=":8787" if cfg.dashboard else None,
        silence_logs=logging.ERROR,
    )
    try:
        # Results and actor calls go straight to the workers of a local cluster.
        with Client(cluster, direct_to_workers=True) as client:
            yield client
    finally:
        cluster.close()
