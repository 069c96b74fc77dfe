"""Watching runs: the ``/rl`` Bokeh page, its standalone server, and learning-curve plots.

The only package that imports ``bokeh``. The page is installed on a Dask scheduler by the
preload :mod:`dask_rl.runtime.dashboard`.
"""
