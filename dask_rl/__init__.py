"""dask-rl: distributed reinforcement learning and population methods on Dask.

>>> import dask_rl
>>> result = dask_rl.train("pipelines/ppo_cartpole.yaml")
>>> result.summary["final_return"]
500.0
"""

from dask_rl.api import RunResult, train
from dask_rl.config import ConfigError, PipelineConfig, load_pipeline

__version__ = "0.1.0"
__all__ = ["ConfigError", "PipelineConfig", "RunResult", "load_pipeline", "train",
           "__version__"]
