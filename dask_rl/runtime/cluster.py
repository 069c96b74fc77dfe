"""Clients for the ``cluster:`` section: an embedded LocalCluster, an existing scheduler (TCP
or TLS), a DaskCluster created by the dask-kubernetes operator, or worker jobs on an HPC batch
system (SLURM, PBS, SGE, LSF through dask-jobqueue); with ``cluster.adapt``,
adaptive scaling driven by the scheduler-side RL policy (:mod:`dask_rl.runtime.adaptive`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import weakref
import zipfile
from pathlib import Path
from typing import Iterator

import dask
from distributed import Client, LocalCluster

from dask_rl.config import ClusterConfig, ConfigError
from dask_rl.config.schema import JOBQUEUE_KINDS

logger = logging.getLogger(__name__)

WORKER_SIGNALS_PRELOAD = "dask_rl.runtime.worker_signals"  # Ctrl-C belongs to the driver
DASHBOARD_PRELOAD = "dask_rl.runtime.dashboard"  # the /rl page (see that module)
# read by that module at import: register no Bokeh page yet (imported, it would import Bokeh)
DEFERRED_DASHBOARD = "dask-rl.dashboard-deferred"
ADAPTIVE_PRELOAD = "dask_rl.runtime.adaptive"    # the RL-aware adaptive target


# Dask's periodic duties, set less often on the embedded cluster: each wakes its process's
# event loop, which then takes the GIL from the task running there. By default every process
# measures its event loop's latency every 20 ms, every worker samples its memory every 100 ms
# and its system metrics (CPU, memory, network, disk) every 500 ms. An idle 2-worker cluster
# spent 8% of a core on them, 2% with these values (measured here); a blocked event loop is
# still reported, memory limits still enforced within half a second.
QUIET = {"distributed.admin.tick.interval": "500ms",
         "distributed.admin.system-monitor.interval": "1s",
         "distributed.admin.system-monitor.disk": False,
         "distributed.worker.memory.monitor-interval": "500ms"}


def rl_page(client: Client) -> str | None:
    """The URL of the ``/rl`` page, if the scheduler serves a dashboard."""
    link = getattr(client, "dashboard_link", None)
    if not link:
        return None
    return link.rsplit("/", 1)[0] + "/rl"


def machine_cores() -> int:
    """CPU cores this process may run on (its affinity set where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def oversubscription(n_workers: int, threads_per_worker: int, cores: int) -> str | None:
    """Why a local cluster of ``n_workers`` x ``threads_per_worker`` threads would run slower
    than its size suggests on ``cores`` cores, or None when it fits. More threads than cores
    time-share them: on 2 cores, 2 workers x 4 threads collected less than half the env steps
    of 2 x 2 (``docs/benchmarks.md``, the staleness sweep)."""
    threads = n_workers * threads_per_worker
    if threads <= cores:
        return None
    return (f"the local cluster runs {n_workers} workers x {threads_per_worker} threads = "
            f"{threads} threads on {cores} cores; tasks will share the cores and run slower "
            f"(cluster.n_workers x cluster.threads_per_worker <= {cores} avoids it)")


@contextlib.contextmanager
def connect(cfg: ClusterConfig, *, address: str | None = None,
            n_workers: int | None = None) -> Iterator[Client]:
    """A client for this pipeline's cluster, closed (with any cluster it started) on exit.

    ``address`` (the CLI's ``--address``) overrides the section and connects to a running
    scheduler; ``n_workers`` (``--workers``) overrides ``cluster.n_workers``.
    """
    address = address or (cfg.address if cfg.kind == "address" else None)
    if address:
        with Client(address, security=_security(cfg)) as client:
            yield client
        return
    if cfg.kind == "kubernetes":
        with _kubernetes(cfg) as client:
            yield client
        return
    if cfg.kind in JOBQUEUE_KINDS:
        with _jobqueue(cfg, n_workers or cfg.n_workers) as client:
            yield client
        return
    preloads = [ADAPTIVE_PRELOAD] + ([DASHBOARD_PRELOAD] if cfg.dashboard else [])
    workers = n_workers or cfg.n_workers
    crowded = oversubscription(workers, cfg.threads_per_worker, machine_cores())
    if crowded:
        logger.warning(crowded)
    settings = {"distributed.worker.profile.enabled": cfg.profile, **QUIET}
    scheduler_kwargs: dict = {"preload": preloads}
    if cfg.dashboard:   # its HTTP server now, Bokeh once the run is going (attach_dashboard)
        settings[DEFERRED_DASHBOARD] = True
        scheduler_kwargs["dashboard"] = False
    if cfg.processes:   # workers forked from a warm process with everything imported
        from dask_rl.runtime.worker_start import dask_settings

        settings.update(dask_settings())
    with dask.config.set(settings):
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=cfg.threads_per_worker,
            processes=cfg.processes,
            memory_limit=cfg.memory_limit,
            dashboard_address=cfg.dashboard_address if cfg.dashboard else None,
            scheduler_kwargs=scheduler_kwargs,
            preload=[WORKER_SIGNALS_PRELOAD] if cfg.processes else None,
            silence_logs=logging.ERROR,
        )
    if cfg.adapt is not None:
        cluster.adapt(minimum=cfg.adapt.minimum, maximum=cfg.adapt.maximum,
                      interval=f"{cfg.adapt.interval_s}s", wait_count=cfg.adapt.wait_count)
    if cfg.dashboard:
        _deferred_dashboards.add(cluster.scheduler)
    try:
        # Results and actor calls go straight to the workers of a local cluster.
        with Client(cluster, direct_to_workers=True) as client:
            yield client
    finally:
        cluster.close()


_deferred_dashboards: weakref.WeakSet = weakref.WeakSet()
_deferred_lock = threading.Lock()   # PBT's members may ask at once: one attaches


def attach_dashboard(client: Client) -> None:
    """Start the dashboard of an embedded cluster that ``connect`` started without it, in the
    background (Bokeh's import takes ~0.4 s of this process, while the workers run the first
    tasks); once per cluster, nothing for any other."""
    scheduler = getattr(getattr(client, "cluster", None), "scheduler", None)
    with _deferred_lock:
        if scheduler is None or scheduler not in _deferred_dashboards:
            return
        _deferred_dashboards.discard(scheduler)
    from dask_rl.runtime.dashboard import attach

    threading.Thread(target=attach, args=(scheduler,), name="dask-rl-dashboard",
                     daemon=True).start()


def upload(client: Client, paths: tuple[str, ...]) -> None:
    """Send ``cluster.upload`` to every worker, and to workers that join later: each file as
    Dask's ``UploadFile`` worker plugin (what ``Client.upload_file`` registers, without the
    scheduler importing it too), which puts it on the workers' ``sys.path`` and imports it. A
    directory is zipped first: a package directory (with ``__init__.py``) as that package, any
    other directory as its contents (dot-directories and ``__pycache__`` left out); zipped code
    is imported from the zip, so it must be pure Python (compiled extensions belong in the
    workers' image). A plugin is named by its content's hash, so the same code is sent once
    per cluster however many runs (a sweep's trials) ask for it."""
    from distributed.diagnostics.plugin import UploadFile

    with tempfile.TemporaryDirectory() as tmp:
        for p in map(Path, paths):
            if p.is_dir():
                src = p.resolve()
                root = src.parent if (src / "__init__.py").exists() else src
                archive = Path(tmp) / f"{src.name}.zip"
                with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
                    for f in sorted(src.rglob("*")):
                        rel = f.relative_to(root)
                        if f.is_file() and f.suffix != ".pyc" and not any(
                                part.startswith(".") or part == "__pycache__"
                                for part in rel.parts):
                            z.write(f, rel)
                p = archive
            digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            named = p
            if p.suffix != ".py":   # a module's file name is its import name; an archive's not
                # distinct names on the workers for distinct contents (two src/ folders)
                named = Path(tmp) / f"{p.stem}-{digest}{p.suffix}"
                shutil.copyfile(p, named)
            plugin = UploadFile(str(named), load=True)
            plugin.idempotent = True   # the scheduler skips a name it has: sent once
            client.register_plugin(plugin, name=f"dask-rl-upload-{digest}")
            logger.info("uploaded %s to the workers as %s", p.name, named.name)


def _security(cfg: ClusterConfig):
    if cfg.security is None:
        return None
    from distributed.security import Security

    s = cfg.security
    return Security(tls_ca_file=s.tls_ca_file, tls_client_cert=s.tls_client_cert,
                    tls_client_key=s.tls_client_key, require_encryption=s.require_encryption)


@contextlib.contextmanager
def _kubernetes(cfg: ClusterConfig) -> Iterator[Client]:
    """A DaskCluster through the dask-kubernetes operator (extra ``k8s``).

    Not exercised here (no API server can run on these machines): the manifests it creates
    are the ones ``dask-rl k8s render`` prints, which the tests validate against the CRDs.
    """
    if cfg.kubernetes.tls_secret is not None:
        raise ConfigError("cluster.kubernetes.tls_secret: KubeCluster reaches the scheduler "
                          "without TLS; apply the manifests of dask-rl k8s render (--job) "
                          "instead, or connect with cluster.kind address and "
                          "cluster.security")
    try:
        from dask_kubernetes.operator import KubeCluster
    except ImportError:
        raise RuntimeError("cluster.kind kubernetes needs the 'k8s' extra "
                           "(pip install 'dask-rl[k8s]')") from None
    from dask_rl.deploy.k8s import render_cluster_spec, render_worker_groups

    k = cfg.kubernetes
    spec = {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskCluster",
            "metadata": {"name": k.name, "namespace": k.namespace},
            "spec": _config_spec(cfg, render_cluster_spec)}
    cluster = KubeCluster(custom_cluster_spec=spec, namespace=k.namespace)
    try:
        for group in _config_spec(cfg, render_worker_groups):
            name = group["metadata"]["name"].removeprefix(f"{k.name}-")
            cluster.add_worker_group(name, n_workers=group["spec"]["worker"]["replicas"],
                                     custom_spec=group["spec"]["worker"])
        if cfg.adapt is not None:
            cluster.adapt(minimum=cfg.adapt.minimum, maximum=cfg.adapt.maximum)
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()


@contextlib.contextmanager
def _jobqueue(cfg: ClusterConfig, n_workers: int) -> Iterator[Client]:
    """Workers as batch jobs (:mod:`dask_rl.deploy.jobqueue`), the scheduler in this process.
    Checked before any job is submitted; every job is cancelled on exit."""
    from dask_rl.deploy.jobqueue import check_batch_system, cluster_class, job_class, job_kwargs

    check_batch_system(cfg)
    jq = cfg.jobqueue
    preloads = [ADAPTIVE_PRELOAD] + ([DASHBOARD_PRELOAD] if cfg.dashboard else [])
    scheduler_options = {"preload": preloads,
                         "dashboard_address": cfg.dashboard_address if cfg.dashboard else None}
    if jq.scheduler_host is not None:
        scheduler_options["host"] = jq.scheduler_host
    settings = {"distributed.worker.profile.enabled": cfg.profile}
    with dask.config.set(settings):
        cluster = cluster_class(cfg.kind)(scheduler_options=scheduler_options,
                                          **job_kwargs(cfg))
    learners = []
    try:
        for i in range(jq.learner_workers):   # fixed, apart from what adapt scales
            job = job_class(cfg.kind)(scheduler=cluster.scheduler_address,
                                      name=f"dask-rl-learner-{i}",
                                      **job_kwargs(cfg, group="learner"))
            cluster.sync(job.start)
            learners.append(job)
        cluster.scale(n=n_workers)   # then, with adapt, the RL policy's target
        if cfg.adapt is not None:
            cluster.adapt(minimum=cfg.adapt.minimum, maximum=cfg.adapt.maximum,
                          interval=f"{cfg.adapt.interval_s}s", wait_count=cfg.adapt.wait_count)
        logger.warning("%s: %d rollout and %d learner job(s) submitted; the run starts when "
                       "the first worker joins (squeue shows them)", cfg.kind,
                       len(cluster.worker_spec), len(learners))
        with Client(cluster) as client:
            client.wait_for_workers(1)
            yield client
    finally:
        for job in learners:
            with contextlib.suppress(Exception):
                cluster.sync(job.close)
        cluster.close()


def _config_spec(cfg: ClusterConfig, render):
    """Render with a pipeline that has this cluster section (the renderers take pipelines)."""
    import dataclasses

    from dask_rl.config import from_dict

    return render(dataclasses.replace(from_dict({}, check_env=False), cluster=cfg))


def special_workers(client: Client) -> tuple[list[str], list[str]]:
    """(parameter-group workers, GPU workers): those offering the ``parameter`` / ``GPU``
    resources."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    param = [a for a, w in workers.items() if w.get("resources", {}).get("parameter")]
    gpu = [a for a, w in workers.items() if w.get("resources", {}).get("GPU")]
    return param, gpu


def place_slots(client: Client, num_slots: int) -> dict[int, str]:
    """Spread rollout slots over the workers in proportion to their threads.

    Rollout tasks are submitted with their slot's worker as a *loose* restriction, so a slot's
    environments (and its unfinished episodes) stay on one worker, and the task still runs
    elsewhere if that worker is gone. Workers of the parameter and GPU learner groups are left
    to their jobs when there are others.
    """
    workers = client.scheduler_info(n_workers=-1)["workers"]
    param, gpu = special_workers(client)
    plain = {a: w for a, w in workers.items() if a not in param and a not in gpu}
    workers = plain or workers
    seats = [addr for addr, w in sorted(workers.items()) for _ in range(w.get("nthreads", 1))]
    if not seats:
        return {}
    return {slot: seats[slot % len(seats)] for slot in range(num_slots)}


def cluster_worker_bytes(client: Client) -> int | None:
    """The smallest worker memory limit of a running cluster (None: no limits known)."""
    limits = [w.get("memory_limit") for w in
              client.scheduler_info(n_workers=-1)["workers"].values()]
    limits = [m for m in limits if m]
    return min(limits) if limits else None


def quiet_dask_logging(level: int) -> None:
    """Set every ``distributed`` logger to ``level`` (distributed configures its loggers when
    first imported, so this imports it first)."""
    import distributed  # noqa: F401

    for name in list(logging.root.manager.loggerDict):
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(level)
