"""dask-rl: distributed reinforcement learning and population methods on Dask.

>>> import dask_rl
>>> result = dask_rl.train("pipelines/ppo_cartpole.yaml")
>>> result.summary["final_return"]
500.0
"""

from dask_rl.api import RunResult, train
from dask_rl.config import ConfigError, PipelineConfig, load_pipeline

__version__ = "0.1.0"
__all__ = ["ConfigError", "Policy", "PipelineConfig", "RunResult", "load_pipeline",
           "load_policy", "sweep", "train", "__version__"]


def __getattr__(name: str):
    # the policy API imports torch; ``import dask_rl`` (and the CLI) stay light without it
    if name in ("Policy", "load_policy"):
        from dask_rl import policy

        return getattr(policy, name)
    if name == "sweep":   # Optuna, imported when a sweep is asked for
        from dask_rl.sweeps import sweep

        return sweep
    raise AttributeError(f"module 'dask_rl' has no attribute {name!r}")
