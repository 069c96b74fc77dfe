"""Algorithm families as runtime components: the driver that trains each kind of algorithm.

An algorithm's family is the base class it derives from (:mod:`dask_rl.algos.base`); the
algorithm itself carries what the rest of the system asks of it (its network, its action
spaces, whether its policy may be sampled). This table adds what only the runtime knows: the
driver of a run, and of a population-based run where the family has one. A new family is
one line here and its base class; a new algorithm of an existing family touches neither.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from dask_rl.algos import registry
from dask_rl.algos.base import Algorithm, EvolutionAlgorithm, LearnerAlgorithm
from dask_rl.algos.replay import ReplayAlgorithm
from dask_rl.config import ConfigError
from dask_rl.config.schema import PipelineConfig


@dataclass(frozen=True)
class Family:
    """A kind of algorithm and the drivers ("module:Class") that train it."""

    name: str
    base: type[Algorithm]
    driver: str
    population_driver: str | None = None   # population-based training of its members


FAMILIES = (
    Family("learner", LearnerAlgorithm, "dask_rl.runtime.driver:Driver",
           population_driver="dask_rl.runtime.pbt:PBTDriver"),
    Family("replay", ReplayAlgorithm, "dask_rl.runtime.driver:Driver"),
    Family("evolution", EvolutionAlgorithm, "dask_rl.runtime.es:ESDriver"),
)


def family_of(algorithm: type[Algorithm]) -> Family:
    for family in FAMILIES:
        if issubclass(algorithm, family.base):
            return family
    raise TypeError(f"{algorithm.__name__} derives from none of the algorithm families "
                    f"({', '.join(f.base.__name__ for f in FAMILIES)})")


def driver_class(cfg: PipelineConfig) -> type:
    """The driver that runs a pipeline: its algorithm family's, or that family's
    population driver when the pipeline has a ``population`` section."""
    family = family_of(registry.get(cfg.algo.name))
    path = family.driver
    if cfg.population is not None:
        if family.population_driver is None:
            raise ConfigError(f"population: population-based training trains gradient "
                              f"learners, got algo.name {cfg.algo.name!r}")
        path = family.population_driver
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
