"""The Python entry point: ``dask_rl.train``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dask_rl.algos import registry
from dask_rl.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    check_environment,
    from_dict,
    load_pipeline,
    public_dict,
    to_dict,
)
from dask_rl.config.schema import JOBQUEUE_KINDS
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
        cfg = from_dict(apply_overrides(to_dict(pipeline), overrides), check_env=False)
        if callable(pipeline.env.entry_point) and cfg.env.entry_point == pipeline.env.name:
            # to_dict wrote the callable as text; the object itself is what workers unpickle
            cfg = dataclasses.replace(cfg, env=dataclasses.replace(
                cfg.env, entry_point=pipeline.env.entry_point))
        check_environment(cfg)
        return cfg
    if isinstance(pipeline, dict):
        return from_dict(apply_overrides(pipeline, overrides or []))
    return load_pipeline(pipeline, overrides)


def with_env(cfg: PipelineConfig, env: Callable[..., Any] | str) -> PipelineConfig:
    """``cfg`` training ``env`` (an entry point: a callable or ``"module:name"``), checked."""
    if not (callable(env) or isinstance(env, str)):
        raise ConfigError(f"env: expected a gymnasium.Env class, a function or 'module:name', "
                          f"got {env!r}")
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, entry_point=env, id=None))
    check_environment(cfg)
    return cfg


RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints", "members", "store.json")
# What a resumed run may change: how it runs, not what it learns (the model or the algorithm).
RESUME_MAY_CHANGE = ("learner", "rollout", "stop", "checkpoint", "cluster", "seed", "logging")
RESUME_ENV_MAY_CHANGE = ("num_envs",)


def check_run_dir(cfg: PipelineConfig, run_dir: Path, *, resume: bool) -> None:
    """Bad run directories, before any cluster starts (:class:`ConfigError`, exit 2).

    A fresh run must not write into a directory that holds a run (nothing saved is
    overwritten); a resumed run must find its checkpoint, and its pipeline may change how it
    runs but not the model or the algorithm (:data:`RESUME_MAY_CHANGE`).
    """
    if not resume:
        held = [f for f in RUN_FILES if (run_dir / f).exists()]
        if held:
            raise ConfigError(f"{run_dir}: already holds a run ({', '.join(held)}); resume it "
                              f"with --resume or choose another --run-dir")
        return
    from dask_rl.checkpoint import (
        CheckpointError,
        CheckpointStore,
        StoreLocation,
        StoreLocationError,
    )

    if cfg.population is not None:
        return  # each member checks its own checkpoints
    try:
        where = StoreLocation.find(run_dir, checkpoint_path=cfg.checkpoint.path)
    except StoreLocationError as e:
        raise ConfigError(f"--resume: {e}") from None
    if where is None:
        raise ConfigError(f"--resume: {run_dir}: no checkpoint to resume from (no store.json, "
                          f"no checkpoints/)")
    if where.run_id is None and cfg.checkpoint.path is not None:
        logger.warning("%s predates per-run checkpoint stores: resuming from the shared %s, "
                       "which may hold another run's checkpoints", run_dir, where.path)
    expect = {} if where.run_id is None else {"run_id": where.run_id}
    try:
        _, meta, _ = CheckpointStore(where.path).load_latest_good(expect=expect)
    except CheckpointError as e:
        raise ConfigError(f"--resume: {e}") from None
    saved = meta.get("config")
    if saved is None:
        return
    now = public_dict(cfg)   # as the checkpoint saved it: credentials redacted alike
    changed = []
    for section, value in now.items():
        if section in RESUME_MAY_CHANGE:
            continue
        old = saved.get(section)
        if section == "env" and isinstance(value, dict) and isinstance(old, dict):
            value = {k: v for k, v in value.items() if k not in RESUME_ENV_MAY_CHANGE}
            old = {k: v for k, v in old.items() if k not in RESUME_ENV_MAY_CHANGE}
        if isinstance(value, dict) and isinstance(old, dict):
            changed += [f"{section}.{k}" for k in sorted(set(value) | set(old))
                        if json.dumps(value.get(k), sort_keys=True)
                        != json.dumps(old.get(k), sort_keys=True)]
        elif json.dumps(value, sort_keys=True) != json.dumps(old, sort_keys=True):
            changed.append(section)
    if changed:
        raise ConfigError(f"--resume: the pipeline differs from its checkpoint in "
                          f"{', '.join(changed)} (the model or the algorithm); resume with "
                          f"the pipeline the run started with")


# The runs this process is training now (a sweep trains several at once, in threads): what an
# interrupt that only the main thread receives must reach.
_RUNNING: dict[int, Any] = {}
_RUNNING_LOCK = threading.Lock()


def interrupt_running(reason: str = "interrupted", *,
                      run_dir: str | os.PathLike | None = None) -> int:
    """Ask the runs this process is training (or the one in ``run_dir``) to stop soon, each
    with a final checkpoint and its summary (``stop_reason`` ``reason``); returns how many
    were asked. Safe from a signal handler and from any thread."""
    with _RUNNING_LOCK:
        drivers = list(_RUNNING.values())
    if run_dir is not None:
        drivers = [d for d in drivers if Path(d.run_dir) == Path(run_dir)]
    for driver in drivers:
        driver.interrupt(reason)
    return len(drivers)


@contextlib.contextmanager
def _graceful_interrupts():
    """The first Ctrl-C (or SIGTERM, as Kubernetes sends before it kills a pod) ends the run
    within 30 s whatever is in flight, with a summary (``stop_reason`` ``interrupted`` unless
    it was solved) and a final checkpoint if the parameter actor still answers
    (:meth:`~dask_rl.runtime.run.Run.interrupt`); a second one aborts at once. Installed
    before the cluster starts: a signal that lands before the driver exists reaches it as soon
    as it does. Yields ``attach(driver)``. Only where signals can be caught (the main thread);
    elsewhere Python's behaviour stays."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda driver: None
        return
    presses = []
    attached: list[Any] = []

    def handler(signum, frame):
        presses.append(signum)
        if len(presses) > 1:
            raise KeyboardInterrupt
        for driver in attached:
            driver.interrupt()
        # os.write: print() may not be re-entered from a signal handler
        os.write(2, b"dask-rl: interrupted: ending within 30 s, with a final checkpoint if the "
                    b"parameter actor answers (Ctrl-C again aborts)\n")

    def attach(driver: Any) -> None:
        attached.append(driver)
        if presses:
            driver.interrupt()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield attach
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def check_memory(cfg: PipelineConfig, worker_bytes: int | None) -> None:
    """Refuse rollout sizes that cannot fit a worker (:mod:`dask_rl.control.memory`)."""
    from dask_rl.algos.base import LearnerAlgorithm

    if not issubclass(registry.get(cfg.algo.name), LearnerAlgorithm) or not worker_bytes:
        return
    from dask_rl.control.memory import check_fits, rollout_bytes
    from dask_rl.envs import env_family, env_spaces

    obs_space, _ = env_spaces(cfg.env)
    need = rollout_bytes(cfg.env.num_envs, cfg.rollout.steps, obs_space.shape,
                         obs_space.dtype.itemsize, env_family(cfg.env))
    check_fits(need, worker_bytes, num_envs=cfg.env.num_envs, steps=cfg.rollout.steps)


UPLOADABLE = (".py", ".zip", ".egg")


def check_upload(paths: tuple[str, ...]) -> None:
    """``cluster.upload`` names files Dask can send, or directories."""
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"cluster.upload: no such file or directory, got {str(p)!r}")
        if p.is_file() and p.suffix not in UPLOADABLE:
            raise ConfigError(f"cluster.upload: expected a {', '.join(UPLOADABLE)} file or a "
                              f"directory, got {str(p)!r}")


def preflight(cfg: PipelineConfig, run_dir: Path, *, resume: bool = False, client: Any = None,
              address: str | None = None, workers: int | None = None) -> bool:
    """The checks that need no cluster: the run directory and, on an embedded cluster, the
    memory estimate (on another cluster it runs once connected). Returns whether the cluster
    is embedded."""
    from dask_rl.runtime.run_lock import RunLock

    RunLock(run_dir).check()
    check_run_dir(cfg, run_dir, resume=resume)
    check_upload(cfg.cluster.upload)
    if cfg.logging.tensorboard or cfg.logging.mlflow is not None:
        from dask_rl import tracking

        tracking.check(cfg)
    if client is None and address is None and cfg.cluster.kind in JOBQUEUE_KINDS:
        from dask_rl.deploy.jobqueue import check_batch_system

        check_batch_system(cfg.cluster)   # before any job is submitted
    embedded = client is None and address is None and cfg.cluster.kind == "local" \
        and cfg.cluster.address is None
    if embedded:
        from dask_rl.runtime.memory_limits import local_worker_bytes

        check_memory(cfg, local_worker_bytes(cfg.cluster, workers))
    return embedded


def default_run_dir(cfg: PipelineConfig, root: str | os.PathLike = "runs") -> Path:
    """``runs/<algo>-<env>-<time>``, created here so that two runs started in the same second
    get two directories (the second one gets ``-2``, and so on)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^a-z0-9_-]+", "-", cfg.env.name.lower()).strip("-")
    base = Path(root) / f"{cfg.algo.name}-{name}-{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()   # atomic: exactly one process creates it
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"{base}: a thousand runs started this second; give --run-dir")


def train(pipeline: str | os.PathLike | PipelineConfig | dict, client: Any = None, *,
          run_dir: str | os.PathLike | None = None, resume: bool = False,
          address: str | None = None, workers: int | None = None,
          overrides: list[str] | None = None,
          progress: Callable[[Progress], None] | None = None,
          env: Callable[..., Any] | str | None = None, hooks: Any = None,
          **fields: Any) -> RunResult:
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
    env
        Your environment instead of the pipeline's: a ``gymnasium.Env`` class or a function
        that returns one (called with ``env.kwargs``), or its ``"module:name"``. Workers get the
        object by pickling: a class or function in an importable module travels by reference
        (the module must be importable on the workers: installed in their image, or sent with
        ``cluster.upload``), one defined in ``__main__`` or a notebook by value.
    hooks
        A :class:`~dask_rl.runtime.hooks.RunHooks`, called at named moments of the run (fault
        injection, instrumentation).

    Examples
    --------
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
    ...     result = dask_rl.train("pipelines/ppo_cartpole.yaml", client=c, run_dir="runs/a")
    >>> result.summary["solved"]
    True
    """
    if client is None and address is None:   # an embedded cluster's workers, warming up
        from dask_rl.runtime.worker_start import warm_start

        warm_start()
    overrides = list(overrides or [])
    overrides += [f"{k.replace('__', '.')}={json.dumps(v)}" for k, v in fields.items()]
    cfg = resolve(pipeline, overrides)
    if env is not None:
        cfg = with_env(cfg, env)
    if resume and run_dir is None:
        raise ConfigError("--resume needs the run directory to resume (--run-dir)")
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    embedded = preflight(cfg, run_dir, resume=resume, client=client, address=address,
                         workers=workers)
    from dask_rl.runtime.cluster import connect
    from dask_rl.runtime.run_lock import RunLock

    started: list[Any] = []   # the driver, once there is one (for an unexpected error)

    def _run(c: Any) -> dict:
        if cfg.cluster.upload:
            from dask_rl.runtime.cluster import upload

            upload(c, cfg.cluster.upload)
        if not embedded:
            from dask_rl.runtime.cluster import cluster_worker_bytes

            check_memory(cfg, cluster_worker_bytes(c))
        driver = driver_class(cfg)(c, cfg, run_dir, progress=progress, resume=resume,
                                   hooks=hooks)
        started.append(driver)
        with _RUNNING_LOCK:
            _RUNNING[id(driver)] = driver
        attach(driver)
        try:
            summary = driver.run().to_dict()
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(id(driver), None)
        # now, not once the cluster has closed (after SIGTERM that can take seconds)
        _write_summary(run_dir, summary)
        return summary

    from dask_rl.runtime.families import driver_class
    from dask_rl.runtime.run import RunFailed

    with RunLock(run_dir), _graceful_interrupts() as attach:
        try:
            if client is not None:
                summary = _run(client)
            else:
                with connect(cfg.cluster, address=address, n_workers=workers) as c:
                    summary = _run(c)
        except RunFailed as e:  # what the run got to, then the one-line error
            _write_summary(run_dir, e.summary)
            raise
        except (ConfigError, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug or an unforeseen failure: still one line and a summary
            raise _unexpected(e, run_dir, started[0] if started else None, cfg) from e
    return RunResult(summary=summary, run_dir=run_dir)


def _unexpected(error: Exception, run_dir: Path, driver: Any, cfg: PipelineConfig):
    """An error nothing expected: its traceback to ``RUN_DIR/traceback.txt``, what the run got
    to into ``summary.json`` (``stop_reason: error``), and a :class:`RunFailed` whose one line
    says where both are."""
    import traceback

    from dask_rl.runtime.run import RunFailed

    line = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    try:
        (run_dir / "traceback.txt").write_text("".join(traceback.format_exception(error)))
    except OSError:
        pass
    if driver is not None:
        failed = driver.fail(f"unexpected error: {line}", "error")
        summary, message = failed.summary, str(failed)
    else:
        summary = {"algorithm": cfg.algo.name, "env_id": cfg.env.name, "stop_reason": "error",
                   "error": line}
        message = f"unexpected error: {line}"
    _write_summary(run_dir, summary)
    return RunFailed(f"{message} (traceback in {run_dir / 'traceback.txt'})", summary)


def _write_summary(run_dir: Path, summary: dict) -> None:
    try:
        with open(run_dir / "summary.json", "w") as f:
            json.dump(summary, f, indent=2)
    except OSError as e:  # a full disk: the summary is printed anyway
        logger.warning("could not write %s: %s", run_dir / "summary.json", e)
