"""Clients for the ``cluster:`` section: an embedded LocalCluster or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import dask
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
    with dask.config.set({"distributed.worker.profile.enabled": cfg.profile}):
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


def place_slots(client: Client, num_slots: int) -> dict[int, str]:
    """Spread rollout slots over the workers in proportion to their threads.

    Rollout tasks are submitted with their slot's worker as a *loose* restriction, so a slot's
    environments (and its unfinished episodes) stay on one worker, and the task still runs
    elsewhere if that worker is gone.
    """
    workers = client.scheduler_info(n_workers=-1)["workers"]
    seats = [addr for addr, w in sorted(workers.items()) for _ in range(w.get("nthreads", 1))]
    if not seats:
        return {}
    return {slot: seats[slot % len(seats)] for slot in range(num_slots)}
