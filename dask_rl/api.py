"""The Python entry point: ``dask_rl.train``."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from dask_rl.algos import registry
from dask_rl.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    from_dict,
    load_pipeline,
    to_dict,
)
from dask_rl.data import Progress

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResult:
    """What a finished run leaves: its summary (as in ``summary.json``) and its directory."""

    summary: dict
    run_dir: Path


def resolve(pipeline: str | os.PathLike | PipelineConfig | dict,
            overrides: list[str] | None = None) -> PipelineConfig:
    """A validated config from a YAML path, a mapping or a config, with ``key=value`` overrides."""
    if isinstance(pipeline, PipelineConfig):
        if not overrides:
            return pipeline
        return from_dict(apply_overrides(to_dict(pipeline), overrides))
    if isinstance(pipeline, dict):
        return from_dict(apply_overrides(pipeline, overrides or []))
    return load_pipeline(pipeline, overrides)


def trainer_class(cfg: PipelineConfig) -> type:
    """The driver that runs a pipeline: by the algorithm's family (evolution: ES), then
    population-based training, else asynchronous learners."""
    family = registry.get(cfg.algo.name).family
    if cfg.population is not None and family != "learner":
        raise ConfigError(f"population: population-based training trains gradient learners, "
                          f"got algo.name {cfg.algo.name!r}")
    if family == "evolution":
        from dask_rl.runtime.es import ESDriver

        return ESDriver
    if cfg.population is not None:
        from dask_rl.runtime.pbt import PBTDriver

        return PBTDriver
    from dask_rl.runtime.driver import Driver

    return Driver


def default_run_dir(cfg: PipelineConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = cfg.env.id.replace("/", "-").lower()
    return Path("runs") / f"{cfg.algo.name}-{name}-{stamp}"


def train(pipeline: str | os.PathLike | PipelineConfig | dict, client: Any = None, *,
          run_dir: str | os.PathLike | None = None, resume: bool = False,
          address: str | None = None, workers: int | None = None,
          overrides: list[str] | None = None,
          progress: Callable[[Progress], None] | None = None, **fields: Any) -> RunResult:
    """Train a pipeline; returns when a stop condition holds.

    Parameters
    ----------
    pipeline
        A YAML path, a mapping shaped like one, or a :class:`~dask_rl.config.PipelineConfig`.
    client
        A connected ``distributed.Client`` to run on; by default the pipeline's ``cluster:``
        section decides (an embedded ``LocalCluster``), closed at the end.
    run_dir
        Where summary.json, metrics.jsonl and checkpoints/ go (default ``runs/<name>-<time>``).
    resume
        Continue from the latest checkpoint in ``run_dir``.
    overrides, **fields
        ``["learner.lr=1e-3"]`` strings, or keyword overrides ``learner__lr=1e-3``.

    Examples
    --------
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
    ...     result = dask_rl.train("pipelines/ppo_cartpole.yaml", client=c, run_dir="runs/a")
    >>> result.summary["solved"]
    True
    """
    overrides = list(overrides or [])
    overrides += [f"{k.replace('__', '.')}={json.dumps(v)}" for k, v in fields.items()]
    cfg = resolve(pipeline, overrides)
    if resume and run_dir is None:
        raise ConfigError("--resume needs the run directory to resume (--run-dir)")
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    from dask_rl.runtime.cluster import connect

    def _run(c: Any) -> dict:
        driver = trainer_class(cfg)(c, cfg, run_dir, progress=progress, resume=resume)
        return driver.run().to_dict()

    if client is not None:
        summary = _run(client)
    else:
        with connect(cfg.cluster, address=address, n_workers=workers) as c:
            summary = _run(c)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    return RunResult(summary=summary, run_dir=run_dir)
