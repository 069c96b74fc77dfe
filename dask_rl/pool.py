"""Population work on a Dask cluster: a drop-in ``multiprocessing.Pool``.

Move an existing ``multiprocessing``-based evaluator to a cluster by changing one line::

    from multiprocessing import Pool      # before
    from dask_rl.pool import Pool         # after

    with Pool(4) as pool:                 # 4 worker processes of an embedded LocalCluster,
        fitness = pool.map(evaluate, candidates)   # or Pool(client=c) / Pool(address=...)

``map`` and ``imap_unordered`` are also here as functions over a client.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from dask_rl.runtime.pool import AsyncResult, Pool

__all__ = ["AsyncResult", "Pool", "imap_unordered", "map"]


def map(func: Callable, iterable: Iterable, *, client: Any = None,  # noqa: A001
        chunksize: int | None = None) -> list:
    """``[func(x) for x in iterable]`` on the cluster of ``client`` (or a local one)."""
    with Pool(client=client) if client is not None else Pool() as pool:
        return pool.map(func, iterable, chunksize)


def imap_unordered(func: Callable, iterable: Iterable, *, client: Any,
                   chunksize: int = 1) -> Iterator:
    """``func(x)`` for each item, yielded as they finish, on ``client``'s cluster."""
    return Pool(client=client).imap_unordered(func, iterable, chunksize)
