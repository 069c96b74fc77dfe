"""HPC batch systems through dask-jobqueue (``cluster.kind`` slurm, pbs, sge, lsf).

Each Dask worker runs as a batch job, by default one worker process per job, so cancelling a
job (``scancel``, a pre-emption, the walltime) takes one worker: the parameter actor's job
gone is a recovery like any lost worker. Two groups:

* **rollout** (the default group): ``cluster.n_workers`` workers, ``cluster.jobqueue.processes``
  per job; ``cluster.adapt`` scales them by the scheduler-side RL policy
  (:mod:`dask_rl.runtime.adaptive`), its bounds in workers as on every other cluster;
* **learner** (``cluster.jobqueue.learner_workers`` jobs, never scaled): one worker per job with
  ``learner_gpus`` GPUs, requested as ``--gres=gpu:N`` on SLURM (on other systems through
  ``learner_extra_directives``) and offered to Dask as the ``GPU`` resource that learners
  with ``learner.gpus > 0`` ask for.

Checked before any job is submitted (:func:`check_batch_system`): the job scripts render, the
submission command is on ``PATH``, and on SLURM the controller answers, the partition exists
and ``sbatch --test-only`` accepts each script (account, resources, memory against the
nodes). A failure is one line (exit 2 from the CLI). Not checked ahead: ``interface`` and
``scheduler_host`` (a wrong one fails as the scheduler starts), and, off SLURM, what only the
batch system knows.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tempfile

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
    extra = list(jq.learner_extra_directives if learner else jq.job_extra_directives)
    worker_args = []   # (jobs run in sessions of their own: the driver's Ctrl-C is its own)
    if learner:
        if cfg.kind == "slurm":
            extra.append(f"--gres=gpu:{jq.learner_gpus}")
        worker_args += ["--resources", f"GPU={jq.learner_gpus}"]
    # the workers read their own Dask config: the profiler as cluster.profile says
    prologue = [f"export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED={cfg.profile}",
                *jq.job_script_prologue]
    kwargs = {"queue": jq.queue, "walltime": walltime(cfg.kind, jq.walltime),
              "cores": jq.cores, "processes": 1 if learner else jq.processes,
              "memory": jq.learner_memory if learner else jq.memory,
              "job_extra_directives": extra, "job_script_prologue": prologue,
              "worker_extra_args": worker_args, "python": jq.python or sys.executable,
              "interface": jq.interface, "log_directory": jq.log_directory,
              "job_name": f"dask-rl-{group}"}
    if jq.account is not None:   # SGE and LSF call it the project
        kwargs["account" if cfg.kind in ("slurm", "pbs") else "project"] = jq.account
    return kwargs


def walltime(kind: str, text: str) -> str:
    """``[D-]HH:MM:SS`` as ``kind`` writes it: SLURM as given, PBS and SGE ``HH:MM:SS`` (days
    as hours), LSF ``HH:MM`` (its -W takes no seconds; they round up to a minute)."""
    days, _, clock = text.rpartition("-")
    h, m, sec = (int(x) for x in clock.split(":"))
    h += 24 * int(days or 0)
    if kind == "slurm":
        return text
    if kind == "lsf":
        m += sec > 0
        h, m = h + m // 60, m % 60
        return f"{h:02d}:{m:02d}"
    return f"{h:02d}:{m:02d}:{sec:02d}"


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
    jq = cfg.jobqueue
    if jq.processes > 1 and cfg.adapt is not None:
        raise ConfigError("cluster.jobqueue.processes: one worker process per job with "
                          "cluster.adapt (closing one worker cancels its whole job, the "
                          "parameter actor's worker with it if it is there)")
    if cfg.n_workers % jq.processes:
        raise ConfigError(f"cluster.n_workers: a multiple of cluster.jobqueue.processes "
                          f"({jq.processes}) workers, got {cfg.n_workers}")
    command = SYSTEMS[cfg.kind][3]
    groups = ("rollout", "learner") if jq.learner_workers else ("rollout",)
    scripts = {group: job_script(cfg, group=group) for group in groups}
    for needed in (command, "sinfo") if cfg.kind == "slurm" else (command,):
        if shutil.which(needed) is None:
            raise ConfigError(f"cluster.kind: {cfg.kind} needs {needed}, which is not on PATH "
                              f"(run on a login node of the cluster)")
    if cfg.kind == "slurm":
        partitions = _slurm_partitions()
        queue = jq.queue
        if queue is not None and queue not in partitions:
            raise ConfigError(f"cluster.jobqueue.queue: no SLURM partition {queue!r} (sinfo "
                              f"lists {', '.join(sorted(partitions)) or 'none'})")
        for group, script in scripts.items():
            _sbatch_test_only(group, script)


def _slurm(*command: str) -> tuple[bool, str]:
    """Run a SLURM command: (whether it succeeded, its stdout or its last error line)."""
    try:
        out = subprocess.run(command, capture_output=True, text=True,
                             timeout=CONTROLLER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"cluster.kind: slurm: the controller did not answer {command[0]} "
                          f"within {CONTROLLER_TIMEOUT_S:.0f} s") from None
    if out.returncode == 0:
        return True, out.stdout
    lines = [x.strip() for x in (out.stderr or out.stdout).splitlines() if x.strip()]
    said = [x for x in lines if any(w in x.lower() for w in ("error", "unable", "failure"))]
    why = (said or lines or ["no output"])[-1][:200]
    return False, why.removeprefix(f"{command[0]}: error: ")


def _sbatch_test_only(group: str, script: str) -> None:
    """SLURM's own check of a job script, which submits nothing: account, partition limits,
    resources (``--gres``), memory and cores against the nodes."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
        f.write(script)
        f.flush()
        ok, why = _slurm("sbatch", "--test-only", f.name)
    if not ok:
        raise ConfigError(f"cluster.jobqueue: SLURM refuses the {group} job ({why})")


def _slurm_partitions() -> set[str]:
    """The partitions the SLURM controller reports (it answering is the check)."""
    ok, out = _slurm("sinfo", "--all", "-h", "-o", "%P")
    if not ok:
        raise ConfigError(f"cluster.kind: slurm: the controller is unreachable (sinfo: {out})")
    return {p.strip().rstrip("*") for p in out.split() if p.strip()}
