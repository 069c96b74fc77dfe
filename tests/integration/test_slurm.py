"""cluster.kind: slurm against a real one-node SLURM (``scripts/local-slurm``, started here and
stopped at the end): the main job's workers are SLURM jobs, seen in ``squeue`` while it runs
and in ``sacct`` after; ``scancel`` of the parameter actor's job at several moments is a
recovery with every push applied once; an adaptive cluster's jobs grow under load and shrink
when idle; a bad key or an unreachable controller is one line, exit 2, and no job.

Needs root (SLURM's daemons); CI runs as root and installs slurm-wlm and munge.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from exactly_once import check_run

import dask_rl
from dask_rl.cli import main
from dask_rl.runtime.hooks import RunHooks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).parents[2]
PIPELINES = ROOT / "pipelines"
SCRIPT = ROOT / "scripts" / "local-slurm"
SLURM = ["cluster.kind=slurm", "cluster.jobqueue.memory=2GB",
         "cluster.jobqueue.scheduler_host=127.0.0.1", "cluster.jobqueue.walltime=00:20:00"]


def _slurm(tmp_path) -> list[str]:
    """SLURM's overrides, the jobs' output in ``tmp_path`` (else slurm-N.out in the cwd)."""
    return [*SLURM, f"cluster.jobqueue.log_directory={tmp_path / 'jobs'}"]


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("SLURM's daemons need root (CI runs as root)")
    out = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    yield
    subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=120)


def _jobs() -> dict[str, tuple[str, str]]:
    """squeue now: job id -> (name, state); nothing if the controller is slow to answer."""
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], capture_output=True,
                             text=True, timeout=10).stdout
    except subprocess.TimeoutExpired:
        return {}
    return {i: (n, s) for i, n, s in (line.split("|") for line in out.splitlines() if line)}


def _accounted() -> dict[str, tuple[str, str]]:
    """sacct (job completion records): job id -> (name, state) of every job that ended."""
    out = subprocess.run(["sacct", "--completion", "-X", "-n", "-P", "-o", "JobID,JobName,State"],
                         capture_output=True, text=True, check=True).stdout
    return {i: (n, s) for i, n, s in (line.split("|")[:3] for line in out.splitlines() if line)}


def _wait_gone(ids, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while set(ids) & set(_jobs()) and time.monotonic() < deadline:
        time.sleep(0.5)


class Watch(RunHooks):
    """Record squeue at every heartbeat; at the ``nth``, ``scancel`` the actor's job."""

    def __init__(self, cancel_at: int | None = None):
        self.cancel_at = cancel_at
        self.beats = 0
        self.seen: dict[str, tuple[str, str]] = {}
        self.peak = 0          # the most rollout jobs running at one heartbeat
        self.cancelled: str | None = None

    def heartbeat(self, run):
        self.beats += 1
        jobs = _jobs()
        self.seen.update(jobs)
        self.peak = max(self.peak, sum(j == ("dask-rl-rollout", "RUNNING")
                                       for j in jobs.values()))
        if self.cancel_at is not None and self.beats == self.cancel_at and not self.cancelled:
            addr = run.supervisor.address
            job = run.client.run(lambda: os.environ["SLURM_JOB_ID"], workers=[addr])[addr]
            subprocess.run(["scancel", job], check=True)
            self.cancelled = job


def test_the_main_job_solves_on_slurm_jobs(slurm, tmp_path):
    cfg = dask_rl.api.resolve(PIPELINES / "ppo_cartpole.yaml", _slurm(tmp_path))
    watch = Watch()
    s = dask_rl.train(cfg, run_dir=tmp_path / "run", hooks=watch).summary
    assert s["solved"], s
    running = {i for i, (name, state) in watch.seen.items()
               if name == "dask-rl-rollout" and state == "RUNNING"}
    assert len(running) == cfg.cluster.n_workers, watch.seen   # a job per worker
    _wait_gone(running)
    assert not running & set(_jobs())                          # cancelled at the end
    assert len(list((tmp_path / "jobs").glob("*.err"))) == len(running)   # the jobs' logs
    ended = _accounted()
    assert all(ended[i][0] == "dask-rl-rollout" for i in running), ended
    assert {ended[i][1] for i in running} <= {"CANCELLED", "COMPLETED"}, ended


@pytest.mark.parametrize("beat", [2, 6, 12])
def test_scancel_of_the_actors_job_is_a_recovery(slurm, tmp_path, beat):
    """Three workers, one per job; the job holding the parameter actor is cancelled at the
    ``beat``-th heartbeat (about 1, 3 and 6 s in). The run recovers on the other jobs, ends
    on its budget, applies every push once and counts the recovery."""
    cfg = dask_rl.api.resolve(PIPELINES / "ppo_cartpole.yaml", _slurm(tmp_path) + [
        "cluster.n_workers=3", "checkpoint.heartbeat_s=0.5", "checkpoint.actor_timeout_s=5",
        # a run of 12 s whatever the machine's speed: the n-th beat of 0.5 s lands in it
        "checkpoint.every_s=1", "stop.env_steps=100000000", "stop.wall_s=12",
        "stop.solve_on_target=false"])  # a solve would end it before the later beats
    watch = Watch(cancel_at=beat)
    run_dir = tmp_path / "run"
    s = dask_rl.train(cfg, run_dir=run_dir, hooks=watch).summary
    assert watch.cancelled, f"the run ended before heartbeat {beat}"
    assert s["recoveries"] >= 1, s
    check_run(run_dir, s, budget="wall_s")
    _wait_gone([watch.cancelled])
    assert _accounted()[watch.cancelled][1] == "CANCELLED"


def _rollout_jobs_running() -> set[str]:
    return {i for i, (name, state) in _jobs().items()
            if name == "dask-rl-rollout" and state == "RUNNING"}


def test_adaptive_jobs_grow_under_load_and_shrink_when_idle(slurm, tmp_path):
    """cluster.adapt between 1 and 3 workers (= jobs): the run's load grows the cluster to 3
    jobs; once it has ended, the idle cluster goes back to 1, and sacct shows the jobs it
    let go ended while the cluster was still up."""
    from dask_rl.runtime.cluster import connect

    cfg = dask_rl.api.resolve(PIPELINES / "ppo_cartpole.yaml", _slurm(tmp_path) + [
        "cluster.adapt.minimum=1", "cluster.adapt.maximum=3", "cluster.adapt.interval_s=0.5",
        "cluster.adapt.wait_count=2", "rollout.slots=6", "learner.max_learners=2",
        "stop.env_steps=100000", "stop.solve_on_target=false", "checkpoint.every_s=5"])
    watch = Watch()
    with connect(cfg.cluster) as client:
        s = dask_rl.train(cfg, client=client, run_dir=tmp_path / "run", hooks=watch).summary
        grown = {i for i, (name, state) in watch.seen.items()
                 if name == "dask-rl-rollout" and state == "RUNNING"}
        deadline = time.monotonic() + 90
        while len(_rollout_jobs_running()) > 1:
            assert time.monotonic() < deadline, "the idle cluster did not shrink"
            time.sleep(0.5)
        kept = _rollout_jobs_running()
        ended_while_up = _accounted()
    assert s["recoveries"] == 0, s
    assert watch.peak == 3, watch.seen        # grew from 1 to its maximum at once
    let_go = grown - kept
    assert len(let_go) >= 2 and all(i in ended_while_up for i in let_go), (let_go,
                                                                         ended_while_up)


@pytest.mark.parametrize("overrides, env, message", [
    (["cluster.jobqueue.queue=no-such-partition"], {},
     "cluster.jobqueue.queue: no SLURM partition 'no-such-partition' (sinfo lists debug)"),
    ([], {"SLURM_CONF": "unreachable"}, "cluster.kind: slurm: the controller is unreachable"),
    # this node has no GPUs: SLURM's own check refuses the learner job before any is submitted
    (["cluster.jobqueue.learner_workers=1"], {},
     "cluster.jobqueue: SLURM refuses the learner job (Invalid generic resource (gres) "
     "specification)"),
])
def test_a_bad_key_or_an_unreachable_controller_submits_nothing(slurm, tmp_path, capsys,
                                                                monkeypatch, overrides, env,
                                                                message):
    before = set(_accounted()) | set(_jobs())
    if env:   # a controller on a port where nothing listens
        conf = tmp_path / "slurm.conf"
        conf.write_text("ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort=6999\n"
                        "MessageTimeout=2\nAuthType=auth/munge\nNodeName=localhost CPUs=1\n"
                        "PartitionName=debug Nodes=localhost Default=YES\n")
        monkeypatch.setenv("SLURM_CONF", str(conf))
    args = ["train", str(PIPELINES / "ppo_cartpole.yaml"), "--run-dir", str(tmp_path / "run")]
    for o in _slurm(tmp_path) + overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert set(_accounted()) | set(_jobs()) == before     # no job was submitted
