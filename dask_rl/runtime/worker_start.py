"""An embedded cluster's workers forked from a warm process, started before the driver has
imported anything heavy.

Dask starts a local worker by spawning a fresh interpreter, which then imports torch,
gymnasium and dask-rl (about a second each on this machine's 2 cores, after the driver has
spent the same second importing them for itself). :func:`warm_start` starts Python's
*forkserver* at once, with those modules as its preload and Dask's pre-spawn environment
(one BLAS/OpenMP thread: the variables that only act before numpy and torch load), while the
driver goes on reading its pipeline; the cluster's workers are then forked from it with
everything imported (`benchmarks/task_cost.py`, ``start_to_first_rollout_s``).

The forkserver is single-threaded and runs no torch operation, so forking it is safe where
forking the driver (threads, an event loop) is not. It is used only where it is known to
match what Dask's nanny would have set up: a forkserver this module started, Dask's
``multiprocessing-method`` left at its default and its ``pre-spawn-environ`` at the values
below; anything else spawns as before. A worker the nanny restarts later is spawned as Dask
does by default.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import threading

logger = logging.getLogger(__name__)

# Dask's default distributed.nanny.pre-spawn-environ (a variable already set in the
# environment wins, as in Dask's nanny)
DASK_PRE_SPAWN_ENVIRON = {"MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
                          "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
HASH_SEED = "6640"   # what Dask's nanny sets so that every worker hashes alike (#8400)
# what a worker imports to run a rollout or a learner (a missing one is skipped)
PRELOAD = ["distributed", "numpy", "torch", "gymnasium", "dask_rl.runtime.plugins",
           "dask_rl.runtime.tasks", "dask_rl.roles.collector", "dask_rl.roles.learner",
           "dask_rl.roles.evaluation", "dask_rl.algos.ppo", "dask_rl.algos.impact",
           "dask_rl.algos.dqn"]

_lock = threading.Lock()
_server: tuple[int | None, dict[str, str]] | None = None   # (pid, environment), if started here


def pre_spawn_environ(config: dict[str, object]) -> dict[str, str]:
    """What Dask's nanny sets before it spawns a worker, for its ``pre-spawn-environ``
    ``config``: each variable from the environment if set there, else the configuration's;
    and the hash seed."""
    env = {k: os.environ.get(k, str(v)) for k, v in config.items() if v is not None}
    if env.get("PYTHONHASHSEED") in (None, "0"):
        env["PYTHONHASHSEED"] = HASH_SEED
    return env


def warm_start() -> bool:
    """Start the forkserver, if this platform has one and nobody else started it; returns at
    once (it imports in the background) and whether the forkserver is this module's."""
    global _server
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver

    with _lock:
        server = getattr(forkserver, "_forkserver", None)
        if _server is None and getattr(server, "_forkserver_pid", None) is not None:
            return False   # someone else's, with its own modules and environment
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        environ = pre_spawn_environ(DASK_PRE_SPAWN_ENVIRON)
        saved = {k: os.environ.get(k) for k in environ}
        os.environ.update(environ)
        try:   # (re)starts it if it is not running, with this environment
            forkserver.ensure_running()
        except Exception as e:   # e.g. called while a spawned process imports its main
            logger.debug("no warm forkserver: %r", e)
            return False
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        pid = getattr(server, "_forkserver_pid", None)
        if _server is None or _server[0] != pid:   # started (again) just now, with these
            _server = (pid, environ)
            if pid is not None:
                atexit.register(_stop, pid, os.getpid())
    return True


def _stop(pid: int, owner: int) -> None:
    """At this process's exit: end the forkserver at once. Left alone it would finish its
    imports first, holding the output pipes it inherited open (``dask-rl train bad.yaml |
    ...`` would wait for it)."""
    if os.getpid() != owner:   # a forked copy of the process that started it
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (OSError, ChildProcessError):   # gone already
        pass


def dask_settings() -> dict:
    """The Dask configuration under which a local cluster's workers fork from the warm
    process, or ``{}`` where they should be spawned as Dask does by default."""
    import dask
    import distributed.utils

    method = dask.config.get("distributed.worker.multiprocessing-method")
    if method != "spawn" or not warm_start() or _server is None:
        return {}
    if pre_spawn_environ(dask.config.get("distributed.nanny.pre-spawn-environ")) != _server[1]:
        return {}
    # Dask sets a forkserver's preload itself the first time, importing pandas and others
    # into the driver to do so; this one is already running with its own
    distributed.utils._forkserver_preload_set = True
    return {"distributed.worker.multiprocessing-method": "forkserver"}
