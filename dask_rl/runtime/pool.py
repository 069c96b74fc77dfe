"""A ``multiprocessing.Pool`` that runs on a Dask cluster (Fiber's one-line move).

Code written against :class:`multiprocessing.pool.Pool` moves to a cluster by changing its
import: ``from dask_rl.pool import Pool``. The methods, their arguments and results are
the same (``map``, ``imap``, ``imap_unordered``, ``starmap``, ``apply``, ``apply_async``,
``map_async``, ``close`` / ``join`` / ``terminate``, the context manager). Items are grouped
into chunks exactly as ``multiprocessing`` groups them, so tasks stay coarse enough that Dask's
per-task cost (about a millisecond) does not show; functions may also be lambdas and closures
(cloudpickle), which ``multiprocessing`` refuses.

Without a ``client`` the pool starts an embedded ``LocalCluster`` of ``processes`` single-threaded
worker processes (default: the machine's cores) and closes it with the pool.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator

from distributed import Client, LocalCluster, WorkerPlugin, as_completed


class _Initializer(WorkerPlugin):
    """Runs a pool's ``initializer(*initargs)`` once on every worker, present and future."""

    def __init__(self, initializer: Callable, initargs: tuple):
        self.initializer = initializer
        self.initargs = initargs

    def setup(self, worker: Any) -> None:
        self.initializer(*self.initargs)


def _run_chunk(func: Callable, chunk: list, star: bool) -> list:
    if star:
        return [func(*args) for args in chunk]
    return [func(x) for x in chunk]


class AsyncResult:
    """What ``apply_async`` / ``map_async`` return, as in ``multiprocessing``."""

    def __init__(self, futures: list, *, single: bool, callback: Callable | None = None,
                 error_callback: Callable | None = None):
        self._futures = futures
        self._single = single
        if callback is not None or error_callback is not None:
            def done(_):
                if all(f.done() for f in futures):
                    try:
                        value = self.get()
                    except Exception as e:
                        if error_callback is not None:
                            error_callback(e)
                        return
                    if callback is not None:
                        callback(value)
            futures[-1].add_done_callback(done)

    def get(self, timeout: float | None = None) -> Any:
        chunks = [f.result(timeout=timeout) for f in self._futures]
        values = [x for chunk in chunks for x in chunk]
        return values[0] if self._single else values

    def wait(self, timeout: float | None = None) -> None:
        from distributed import wait

        try:
            wait(self._futures, timeout=timeout)
        except TimeoutError:
            pass

    def ready(self) -> bool:
        return all(f.done() for f in self._futures)

    def successful(self) -> bool:
        if not self.ready():
            raise ValueError("the result is not ready")
        return all(f.status == "finished" for f in self._futures)


class Pool:
    """A process pool whose workers are a Dask cluster's.

    Examples
    --------
    >>> from dask_rl.pool import Pool      # was: from multiprocessing import Pool
    >>> with Pool(2) as pool:
    ...     pool.map(evaluate, candidates)
    """

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: tuple = (), maxtasksperchild: int | None = None, *,
                 client: Client | None = None, address: str | None = None):
        self._cluster = None
        if client is not None:
            self.client = client
            self._own_client = False
        elif address is not None:
            self.client = Client(address)
            self._own_client = True
        else:
            self._cluster = LocalCluster(n_workers=processes or os.cpu_count() or 1,
                                         threads_per_worker=1, processes=True,
                                         dashboard_address=None, silence_logs=40)
            self.client = Client(self._cluster)
            self._own_client = True
        if initializer is not None:
            self.client.register_plugin(_Initializer(initializer, tuple(initargs)))
        self._closed = False
        self._pending: list = []

    # ---- sizing --------------------------------------------------------------------------------
    @property
    def _processes(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def _chunksize(self, n: int) -> int:
        """``multiprocessing``'s rule: about four chunks per worker process."""
        size, extra = divmod(n, self._processes * 4)
        return size + 1 if extra else max(size, 1)

    def _submit(self, func: Callable, items: list, chunksize: int | None,
                star: bool = False) -> list:
        if self._closed:
            raise ValueError("Pool not running")
        size = chunksize or self._chunksize(len(items))
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        futures = [self.client.submit(_run_chunk, func, chunk, star, pure=False)
                   for chunk in chunks]
        # kept for join / terminate; finished ones are let go so results do not pile up
        self._pending = [f for f in self._pending if not f.done()] + futures
        return futures

    # ---- the multiprocessing.Pool interface ----------------------------------------------------
    def map(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        return self.map_async(func, iterable, chunksize).get()

    def starmap(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        return self.starmap_async(func, iterable, chunksize).get()

    def map_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                  callback: Callable | None = None,
                  error_callback: Callable | None = None) -> AsyncResult:
        futures = self._submit(func, list(iterable), chunksize)
        return AsyncResult(futures, single=False, callback=callback,
                           error_callback=error_callback) if futures else _Done([])

    def starmap_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                      callback: Callable | None = None,
                      error_callback: Callable | None = None) -> AsyncResult:
        futures = self._submit(func, [tuple(a) for a in iterable], chunksize, star=True)
        return AsyncResult(futures, single=False, callback=callback,
                           error_callback=error_callback) if futures else _Done([])

    def apply(self, func: Callable, args: tuple = (), kwds: dict | None = None) -> Any:
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable, args: tuple = (), kwds: dict | None = None,
                    callback: Callable | None = None,
                    error_callback: Callable | None = None) -> AsyncResult:
        kwds = kwds or {}
        futures = self._submit(lambda a: func(*a, **kwds), [tuple(args)], 1)
        return AsyncResult(futures, single=True, callback=callback,
                           error_callback=error_callback)

    def imap(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> Iterator:
        """Results in order, each as soon as it and all before it are done."""
        for fut in self._submit(func, list(iterable), chunksize):
            yield from fut.result()

    def imap_unordered(self, func: Callable, iterable: Iterable,
                       chunksize: int = 1) -> Iterator:
        """Results in the order they finish."""
        for fut in as_completed(self._submit(func, list(iterable), chunksize)):
            yield from fut.result()

    def close(self) -> None:
        self._closed = True

    def terminate(self) -> None:
        self._closed = True
        if self._pending:
            self.client.cancel(self._pending)
        self._shutdown()

    def join(self) -> None:
        if not self._closed:
            raise ValueError("Pool is still running")
        from distributed import wait

        if self._pending:
            wait(self._pending)
        self._shutdown()

    def _shutdown(self) -> None:
        self._pending = []
        if self._own_client:
            self.client.close()
            self._own_client = False
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.terminate()  # as multiprocessing.Pool's context manager does


class _Done(AsyncResult):
    def __init__(self, value: Any):
        self._value = value
        self._futures = []

    def get(self, timeout: float | None = None) -> Any:
        return self._value

