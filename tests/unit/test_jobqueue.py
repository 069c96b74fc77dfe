"""cluster.kind slurm/pbs/sge/lsf: the job scripts dask-rl renders and its checks before any
job is submitted (the real SLURM runs are in tests/integration/test_slurm.py)."""

import os
import shlex
import sys

import pytest

from dask_rl.cli import main
from dask_rl.config import ConfigError, load_pipeline
from dask_rl.deploy.jobqueue import check_batch_system, job_script, walltime


def _cluster(pipelines, *overrides):
    return load_pipeline(pipelines / "ppo_cartpole.yaml",
                         ["cluster.kind=slurm", *overrides]).cluster


def _directives(script: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in script.splitlines()
            if line.startswith(prefix)]


def _worker_command(script: str) -> list[str]:
    return shlex.split(next(line for line in script.splitlines()
                            if "distributed.cli.dask_worker" in line))


def test_a_slurm_rollout_job_asks_for_what_the_pipeline_says(pipelines):
    cfg = _cluster(pipelines, "cluster.jobqueue.queue=gpu-short", "cluster.jobqueue.account=rl",
                   "cluster.jobqueue.walltime=02:30:00", "cluster.jobqueue.cores=4",
                   "cluster.jobqueue.memory=8GB", "cluster.jobqueue.processes=2",
                   "cluster.jobqueue.job_extra_directives=[--constraint=haswell]",
                   "cluster.jobqueue.job_script_prologue=[module load python]")
    script = job_script(cfg)
    sbatch = _directives(script, "#SBATCH")
    for expected in ("-p gpu-short", "-A rl", "-t 02:30:00", "--cpus-per-task=4",
                     "--mem=8G", "--constraint=haswell", "-J dask-rl-rollout"):
        assert expected in sbatch, (expected, sbatch)
    assert not any("gres" in d for d in sbatch)
    assert "module load python" in script
    cmd = _worker_command(script)
    assert cmd[0] == sys.executable
    assert cmd[cmd.index("--nworkers") + 1] == "2"       # 2 worker processes in the job
    assert cmd[cmd.index("--nthreads") + 1] == "2"       # of 2 threads each (4 cores)
    assert "--resources" not in cmd


def test_a_learner_job_requests_gpus_and_offers_them_to_dask(pipelines):
    """--gres=gpu:N in the script and GPU=N among the worker's resources, which learners with
    learner.gpus > 0 ask for; one worker per job, whatever the rollout jobs hold."""
    cfg = _cluster(pipelines, "cluster.jobqueue.learner_workers=2",
                   "cluster.jobqueue.learner_gpus=2", "cluster.jobqueue.learner_memory=32GiB",
                   "cluster.jobqueue.processes=1")
    script = job_script(cfg, group="learner")
    sbatch = _directives(script, "#SBATCH")
    assert "--gres=gpu:2" in sbatch and "--mem=32G" in sbatch and "-J dask-rl-learner" in sbatch
    cmd = _worker_command(script)
    assert cmd[cmd.index("--resources") + 1] == "GPU=2"
    assert "--nworkers" not in cmd


@pytest.mark.parametrize("kind, prefix, expected", [
    ("pbs", "#PBS", ["-q batch", "-A rl", "-l walltime=01:00:00"]),
    ("sge", "#$", ["-q batch", "-P rl", "-l h_rt=01:00:00"]),
    ("lsf", "#BSUB", ["-q batch", '-P "rl"', "-W 01:00"]),
])
def test_other_batch_systems_take_the_same_keys(pipelines, kind, prefix, expected):
    cfg = load_pipeline(pipelines / "ppo_cartpole.yaml",
                        [f"cluster.kind={kind}", "cluster.jobqueue.queue=batch",
                         "cluster.jobqueue.account=rl"]).cluster
    got = _directives(job_script(cfg), prefix)
    for e in expected:
        assert e in got, (e, got)


@pytest.mark.parametrize("override, message", [
    ("cluster.jobqueue.walltime=10h", "cluster.jobqueue.walltime: [D-]HH:MM:SS"),
    ("cluster.jobqueue.walltime=01:30", "cluster.jobqueue.walltime: [D-]HH:MM:SS"),
    ("cluster.jobqueue.memory=lots", "cluster.jobqueue.memory: a size such as 4GB"),
    ("cluster.jobqueue.processes=3", "processes: at most cores (1)"),
    ("cluster.jobqueue.partition=debug", "partition"),
    ("cluster.kind=torque", "cluster.kind"),
])
def test_bad_keys_are_one_line_before_anything_starts(pipelines, capsys, tmp_path, override,
                                                      message):
    assert main(["train", str(pipelines / "ppo_cartpole.yaml"), "--run-dir",
                 str(tmp_path / "run"), "--set", "cluster.kind=slurm", "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_no_submission_command_is_one_line(pipelines, monkeypatch):
    monkeypatch.setenv("PATH", os.devnull)
    with pytest.raises(ConfigError, match="slurm needs sbatch, which is not on PATH"):
        check_batch_system(_cluster(pipelines))


def test_walltimes_in_each_systems_form():
    """Worked by hand: a day is 24 h; LSF's -W has no seconds, so they round up."""
    assert walltime("slurm", "1-02:30:00") == "1-02:30:00"
    assert walltime("pbs", "1-02:30:00") == "26:30:00"
    assert walltime("sge", "00:05:09") == "00:05:09"
    assert walltime("lsf", "01:00:30") == "01:01"
    assert walltime("lsf", "00:59:59") == "01:00"
    assert walltime("lsf", "2-00:00:00") == "48:00"


def test_learner_directives_and_the_profiler_reach_their_jobs(pipelines):
    cfg = _cluster(pipelines, "cluster.jobqueue.learner_workers=1",
                   "cluster.jobqueue.job_extra_directives=[--constraint=cpu]",
                   "cluster.jobqueue.learner_extra_directives=[--constraint=a100]")
    rollout, learner = job_script(cfg), job_script(cfg, group="learner")
    assert "--constraint=cpu" in _directives(rollout, "#SBATCH")
    assert "--constraint=a100" not in _directives(rollout, "#SBATCH")
    assert "--constraint=a100" in _directives(learner, "#SBATCH")
    assert "--constraint=cpu" not in _directives(learner, "#SBATCH")
    # the workers read their own Dask config: the profiler off unless cluster.profile
    assert "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False" in rollout
    on = _cluster(pipelines, "cluster.profile=true")
    assert "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True" in job_script(on)


@pytest.mark.parametrize("overrides, message", [
    (["cluster.jobqueue.cores=2", "cluster.jobqueue.processes=2", "cluster.adapt.maximum=4"],
     "one worker process per job with cluster.adapt"),
    (["cluster.jobqueue.cores=2", "cluster.jobqueue.processes=2", "cluster.n_workers=3"],
     "cluster.n_workers: a multiple of cluster.jobqueue.processes (2) workers, got 3"),
])
def test_job_shapes_that_would_close_or_add_workers_are_refused(pipelines, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_batch_system(_cluster(pipelines, *overrides))
