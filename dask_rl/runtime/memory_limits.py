"""How much memory an embedded cluster's workers will have, before the cluster starts.

Kept apart from :mod:`dask_rl.runtime.cluster` so that checking a pipeline imports no
``distributed`` (bad input fails before anything of a cluster is loaded).
"""

from __future__ import annotations

from dask_rl.config import ClusterConfig


def local_worker_bytes(cfg: ClusterConfig, workers: int | None = None) -> int | None:
    """Each embedded worker's memory: its limit, or this machine's memory shared out (what
    ``memory_limit="auto"`` gives)."""
    import psutil
    from dask.utils import parse_bytes

    limit = cfg.memory_limit
    if limit not in ("auto", None, 0, "0"):
        return parse_bytes(limit) if isinstance(limit, str) else int(limit)
    return psutil.virtual_memory().total // max(workers or cfg.n_workers, 1)
