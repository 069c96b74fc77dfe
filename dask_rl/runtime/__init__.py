"""Everything that touches Dask: cluster, worker plugins, tasks, parameter actor, driver."""
