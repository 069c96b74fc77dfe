import time

import pytest


def _start():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=50)
    return cluster, Client(cluster)


def _settled(client, timeout: float = 10.0) -> bool:
    """Two workers and no task left on the scheduler (what a test's run leaves when it ends
    cleanly), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            workers = len(client.scheduler_info()["workers"])
            tasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        except Exception:  # a scheduler that went away
            return False
        if workers == 2 and tasks == 0:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def _module_cluster():
    """One cluster for a module's tests: starting two worker processes costs ~4 s a test."""
    held = dict(zip(("cluster", "client"), _start()))
    yield held
    held["client"].close()
    held["cluster"].close()


@pytest.fixture
def local_client(_module_cluster):
    """A LocalCluster with 2 worker processes, 1 thread each: this machine's shape, as a user's
    cluster is, shared by the tests of a module. Each test gets it with 2 workers and no task
    on it; one that left it otherwise (a lost worker, tasks still there) gets a new one."""
    held = _module_cluster
    if not _settled(held["client"]):
        held["client"].close()
        held["cluster"].close()
        held["cluster"], held["client"] = _start()
    yield held["client"]
