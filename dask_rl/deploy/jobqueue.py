"""HPC batch systems through dask-jobqueue (``cluster.kind`` slurm, pbs, sge, lsf).

Each Dask worker runs as a batch job, by default one worker process per job, so cancelling a
job (``scancel``, a pre-emption, the walltime) takes one worker: the parameter actor's job
gone is a recovery like any lost worker. Two groups:

* **rollout** (the default group): ``cluster.n_workers`` workers, ``cluster.jobqueue.processes``
  per job; ``cluster.adapt`` scales them by the scheduler-side RL policy
  (:mod:`dask_rl.runtime.adaptive`), its bounds in workers as on every other cluster;
* **learner** (``cluster.jobqueue.learner_workers`` jobs, never scaled): one worker per job with
  ``learner_gpus`` GPUs, requested as ``--gres=gpu:N`` on SLURM (a directive the user gives
  on other systems) and offered to Dask as the ``GPU`` resource that learners with
  ``learner.gpus > 0`` ask for.

Everything is validated before any job is submitted (:func:`check_batch_system`): the
submission command on ``PATH``, the controller answering and the queue existing (SLURM),
and the job script rendering. A failure is one line (exit 2 from the CLI).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys

from dask_rl.config import ClusterConfig, ConfigError

# kind -> (module, job class, cluster class, the command a job is submitted with)
SYSTEMS = {"slurm": ("dask_jobqueue.slurm", "SLURMJob", "SLURMCluster", "sbatch"),
           "pbs": ("dask_jobqueue.pbs", "PBSJob", "PBSCluster", "qsub"),
           "sge": ("dask_jobqueue.sge", "SGEJob", "SGECluster", "qsub"),
           "lsf": ("dask_jobqueue.lsf", "LSFJob", "LSFCluster", "bsub")}
CONTROLLER_TIMEOUT_S = 15.0
PLACEHOLDER_SCHEDULER = "tcp://SCHEDULER:8786"


def _module(kind: str):
    try:
        return importlib.import_module(SYSTEMS[kind][0])
    except ImportError:
        raise ConfigError(f"cluster.kind: {kind} needs the 'hpc' extra (pip install "
                          f"'dask-rl[hpc]')") from None


def job_class(kind: str):
    return getattr(_module(kind), SYSTEMS[kind][1])


def cluster_class(kind: str):
    return getattr(_module(kind), SYSTEMS[kind][2])


def job_kwargs(cfg: ClusterConfig, *, group: str = "rollout") -> dict:
    """dask-jobqueue's keyword arguments for one job of ``group`` (rollout or learner)."""
    jq = cfg.jobqueue
    learner = group == "learner"
    extra = list(jq.job_extra_directives)
    worker_args = []   # (jobs run in sessions of their own: the driver's Ctrl-C is its own)
    if learner:
        if cfg.kind == "slurm":
            extra.append(f"--gres=gpu:{jq.learner_gpus}")
        worker_args += ["--resources", f"GPU={jq.learner_gpus}"]
    kwargs = {"queue": jq.queue, "walltime": jq.walltime,
              "cores": jq.cores, "processes": 1 if learner else jq.processes,
              "memory": jq.learner_memory if learner else jq.memory,
              "job_extra_directives": extra, "job_script_prologue": list(jq.job_script_prologue),
              "worker_extra_args": worker_args, "python": jq.python or sys.executable,
              "interface": jq.interface, "log_directory": jq.log_directory,
              "job_name": f"dask-rl-{group}"}
    if jq.account is not None:   # SGE and LSF call it the project
        kwargs["account" if cfg.kind in ("slurm", "pbs") else "project"] = jq.account
    if cfg.kind == "lsf" and jq.walltime.count(":") == 2:   # LSF's -W takes [HH:]MM
        kwargs["walltime"] = jq.walltime.rsplit(":", 1)[0]
    return kwargs


def job_script(cfg: ClusterConfig, *, group: str = "rollout",
               scheduler: str = PLACEHOLDER_SCHEDULER) -> str:
    """The batch script one job of ``group`` is submitted with."""
    try:
        job = job_class(cfg.kind)(scheduler=scheduler, name=f"dask-rl-{group}",
                                  **job_kwargs(cfg, group=group))
        return job.job_script()
    except ConfigError:
        raise
    except Exception as e:   # dask-jobqueue's own checks of its keys
        raise ConfigError(f"cluster.jobqueue: {cfg.kind} cannot render a job script: "
                          f"{' '.join(str(e).split())}") from None


def check_batch_system(cfg: ClusterConfig) -> None:
    """Everything that can be checked before a job is submitted; one line if not."""
    command = SYSTEMS[cfg.kind][3]
    for group in ("rollout", "learner") if cfg.jobqueue.learner_workers else ("rollout",):
        job_script(cfg, group=group)
    if shutil.which(command) is None:
        raise ConfigError(f"cluster.kind: {cfg.kind} submits jobs with {command}, which is "
                          f"not on PATH (run on a login node of the cluster)")
    if cfg.kind == "slurm":
        partitions = _slurm_partitions()
        queue = cfg.jobqueue.queue
        if queue is not None and queue not in partitions:
            raise ConfigError(f"cluster.jobqueue.queue: no SLURM partition {queue!r} (sinfo "
                              f"lists {', '.join(sorted(partitions)) or 'none'})")


def _slurm_partitions() -> set[str]:
    """The partitions the SLURM controller reports (it answering is the check)."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                             timeout=CONTROLLER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"cluster.kind: slurm: the controller did not answer sinfo within "
                          f"{CONTROLLER_TIMEOUT_S:.0f} s") from None
    if out.returncode != 0:
        lines = [x.strip() for x in (out.stderr or out.stdout).splitlines() if x.strip()]
        said = [x for x in lines if "error" in x.lower() or "unable" in x.lower()] or lines
        why = said[-1].removeprefix("sinfo: error: ")[:200] if said else "no output"
        raise ConfigError(f"cluster.kind: slurm: the controller is unreachable (sinfo: {why})")
    return {p.strip().rstrip("*") for p in out.stdout.split() if p.strip()}
