"""One driver per run directory: ``RUN_DIR/.lock``.

The lock is a file created atomically (``O_CREAT | O_EXCL``) holding the owner's host, process
id and start time. A second driver on the same run directory is refused with a
:class:`~dask_rl.config.ConfigError` (exit 2) naming the owner. A lock left by a driver that
was killed (``kill -9``, a power cut) is *stale* when its host is this host and its process no
longer exists; it is then taken over. A lock from another host cannot be checked from here:
the message says which file to delete once that driver is known to be gone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from dask_rl.config import ConfigError

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """Hold ``run_dir``'s lock while a driver writes the run (a context manager)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_NAME
        self.held = False

    def check(self) -> None:
        """Raise :class:`ConfigError` if a live driver holds the lock (takes nothing)."""
        if self.path.exists():
            owner = self._owner()
            if owner is not None and not self._stale(owner):
                self._refuse(owner)

    def _refuse(self, owner: dict) -> None:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("since", 0)))
        raise ConfigError(
            f"{self.path.parent}: in use by another driver (pid {owner.get('pid')} on "
            f"{owner.get('host')}, since {since}); if it is gone, delete {self.path}")

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and not self._stale(owner):
                    self._refuse(owner)
                logger.warning("taking over the stale lock %s (%s)", self.path, owner)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise ConfigError(f"{self.path.parent}: could not take its lock {self.path}")

    def _owner(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # torn or vanished: treated as stale

    @staticmethod
    def _stale(owner: dict) -> bool:
        return owner.get("host") == socket.gethostname() and not _alive(int(owner.get("pid", 0)))

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
