"""Pipeline configuration: the schema (:mod:`~dask_rl.config.schema`), the validating loader
(:mod:`~dask_rl.config.loader`) and the generated reference (:mod:`~dask_rl.config.reference`).

Lower layers (algorithms, strategies, environments, models) import the schema module
directly; this package's names are for the layers above.
"""

from dask_rl.config.loader import (
    apply_overrides,
    check_environment,
    from_dict,
    load_pipeline,
    public_dict,
    to_dict,
)
from dask_rl.config.schema import (
                                   AggregationConfig,
                                   AlgoConfig,
                                   ClusterConfig,
                                   ConfigError,
                                   EnvConfig,
                                   ModelConfig,
                                   PipelineConfig,
)

__all__ = ["AggregationConfig", "AlgoConfig", "ClusterConfig", "ConfigError", "EnvConfig",
           "ModelConfig", "PipelineConfig", "apply_overrides", "check_environment", "from_dict",
           "load_pipeline",
           "public_dict", "to_dict"]
