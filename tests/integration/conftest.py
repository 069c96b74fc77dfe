import pytest


@pytest.fixture
def local_client():
    """A LocalCluster with 2 worker processes, 1 thread each: this machine's shape."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster:
        with Client(cluster) as client:
            yield client
