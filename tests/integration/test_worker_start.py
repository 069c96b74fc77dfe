"""An embedded cluster's workers fork from the warm forkserver (torch already imported, Dask's
pre-spawn environment in place), and are spawned as Dask does where that would not match."""

import os
import sys
from multiprocessing import forkserver

import dask
import pytest

from dask_rl.config import from_dict
from dask_rl.runtime import worker_start
from dask_rl.runtime.cluster import connect

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no forkserver on Windows")


def _worker_view():
    return {"ppid": os.getppid(), "torch": "torch" in sys.modules,
            "probe": os.environ.get("DASK_RL_PROBE"),
            "env": {k: os.environ.get(k) for k in [*worker_start.DASK_PRE_SPAWN_ENVIRON,
                                                   "PYTHONHASHSEED"]}}


# dask-rl's default; the suite's conftest forks every cluster
SPAWN = {"distributed.worker.multiprocessing-method": "spawn"}


def _cluster_cfg():
    return from_dict({"cluster": {"n_workers": 2, "dashboard": False}}, check_env=False).cluster


def test_the_warm_environment_is_what_dasks_nanny_sets_before_a_spawn():
    import distributed  # noqa: F401  (its configuration defaults)
    from distributed.nanny import _get_env_variables

    dask_defaults = {k: str(v) for k, v in
                     dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    assert dask_defaults == worker_start.DASK_PRE_SPAWN_ENVIRON
    # and what the nanny makes of them, the environment's values first
    config = {"distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": 1, "A_VAR": "x",
                                                      "UNSET": None}}
    with dask.config.set(config):
        nanny = _get_env_variables("distributed.nanny.pre-spawn-environ")
        assert {**nanny, "PYTHONHASHSEED": "6640"} == worker_start.pre_spawn_environ(
            config["distributed.nanny.pre-spawn-environ"])


def test_workers_fork_from_the_warm_process_with_torch_imported():
    assert worker_start.warm_start()
    with dask.config.set(SPAWN), connect(_cluster_cfg()) as client:
        views = list(client.run(_worker_view).values())
    server = forkserver._forkserver._forkserver_pid
    assert len(views) == 2
    for v in views:
        assert v["ppid"] == server
        assert v["torch"]                       # imported before the worker existed
        expected = worker_start.pre_spawn_environ(worker_start.DASK_PRE_SPAWN_ENVIRON)
        assert v["env"] == expected


def test_a_changed_pre_spawn_environment_is_spawned_as_dask_does():
    # a variable of its own (those in this process's environment win over the configuration:
    # a nanny writes its pre-spawn variables into the environment of the process it runs in)
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ"), "DASK_RL_PROBE": "2"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ, **SPAWN}):
        with connect(_cluster_cfg()) as client:
            views = list(client.run(_worker_view).values())
    for v in views:
        assert v["ppid"] == os.getpid()          # the nanny, in this process, spawned it
        assert v["probe"] == "2"
