"""What one task does, in one process, without Dask: the single-process building blocks.

:class:`~dask_rl.roles.collector.Collector` steps a rollout slot's environments,
:class:`~dask_rl.roles.learner.Learner` turns a trajectory into a parameter delta,
:func:`~dask_rl.roles.evaluation.evaluate` plays greedy episodes and
:class:`~dask_rl.roles.es_evaluator.ESEvaluator` plays ES perturbations. The runtime's tasks
call them; a single process can too (the time-to-solve benchmark's baseline does).
"""
