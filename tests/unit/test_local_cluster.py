"""The embedded cluster warns when its threads outnumber the machine's cores."""

import logging

from dask_rl.config import ClusterConfig
from dask_rl.runtime.cluster import connect, machine_cores, oversubscription


def test_oversubscription_counts_every_workers_threads_against_the_cores():
    assert oversubscription(2, 1, cores=2) is None
    assert oversubscription(2, 2, cores=4) is None
    crowded = oversubscription(2, 4, cores=2)
    assert crowded is not None and "8 threads on 2 cores" in crowded
    assert oversubscription(3, 1, cores=2) is not None       # workers alone can crowd
    assert oversubscription(1, 3, cores=2) is not None       # so can one worker's threads


def test_connect_warns_once_for_a_crowded_local_cluster_and_not_for_one_that_fits(caplog):
    cores = machine_cores()
    crowded = ClusterConfig(n_workers=1, threads_per_worker=cores + 1, processes=False,
                            dashboard=False)
    fits = ClusterConfig(n_workers=1, threads_per_worker=1, processes=False, dashboard=False)
    with caplog.at_level(logging.WARNING, logger="dask_rl.runtime.cluster"):
        with connect(crowded) as client:
            assert sum(client.nthreads().values()) == cores + 1
        said = [r.getMessage() for r in caplog.records if r.name == "dask_rl.runtime.cluster"]
        assert len(said) == 1 and f"{cores + 1} threads on {cores} cores" in said[0]
        caplog.clear()
        with connect(fits):
            pass
        assert not [r for r in caplog.records if r.name == "dask_rl.runtime.cluster"]
