"""Pure algorithm math: losses, targets, updates. No Dask, no I/O, explicit RNGs.

Each algorithm declares its config and needs (:mod:`dask_rl.algos.base`) and is found by name
(:mod:`dask_rl.algos.registry`).
"""
