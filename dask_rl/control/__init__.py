"""The decisions a run takes, without Dask: what to launch next, how many workers to want,
where trajectories went, when to evaluate. Each is driven by events and tested with scripted
scenarios, no cluster (as ``AdaptiveCore`` is in distributed); :mod:`dask_rl.runtime` executes
them."""
