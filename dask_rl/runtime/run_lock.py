"""One driver per run directory: ``RUN_DIR/.lock``.

The driver holds an exclusive ``flock`` on ``RUN_DIR/.lock`` for as long as it runs; the file
also says who holds it (host, process id, start time) for the error message. The kernel drops
the lock when the process ends, however it ends (``kill -9``, a crash): a killed driver's lock
is never stale, and there is no window in which two drivers can both believe they hold it.
A second driver on the same directory is refused with a :class:`~dask_rl.config.ConfigError`
(exit 2). On a network filesystem without working ``flock`` (some NFS setups) the lock only
guards drivers on one host.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from dask_rl.config import ConfigError

LOCK_NAME = ".lock"


class RunLock:
    """Hold ``run_dir``'s lock while a driver writes the run (a context manager)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def _take(self) -> int:
        """The open, locked file descriptor, or ConfigError naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = self._owner(fd)
            os.close(fd)
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("since", 0)))
            raise ConfigError(
                f"{self.path.parent}: in use by another driver (pid {owner.get('pid', '?')} on "
                f"{owner.get('host', '?')}, since {since})") from None
        return fd

    @staticmethod
    def _owner(fd: int) -> dict:
        try:
            return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (OSError, ValueError):
            return {}

    def check(self) -> None:
        """Raise :class:`ConfigError` if another driver holds the lock (takes nothing)."""
        if self.path.exists():
            fd = self._take()
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def acquire(self) -> "RunLock":
        fd = self._take()
        me = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
