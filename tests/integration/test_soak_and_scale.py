"""A shortened soak (bounds asserted) and runs on many workers."""

import sys
from pathlib import Path

import pytest

import dask_rl

pytestmark = pytest.mark.timeout(900)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_short_soak_keeps_memory_flat_and_loses_nothing(tmp_path):
    import soak

    data = soak.soak(minutes=1.5, sample_s=5.0, workdir=tmp_path)
    verdict = soak.check(data, max_growth_mb=64.0)
    assert verdict["nothing_lost"], verdict
    assert verdict["memory_flat"], verdict
    assert verdict["no_backlog_growth"], verdict
    assert data["summary"]["trajectories_produced"] > 100


def _tiny():
    return {"stop": {"env_steps": 20_000, "solve_on_target": False, "eval_every_updates": 0},
            "learner": {"max_learners": 8}, "checkpoint": {"every_s": 0}}


def test_32_thread_workers_in_process(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=32, threads_per_worker=1, processes=False,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        s = dask_rl.train(_tiny(), client=client, run_dir=tmp_path / "threads").summary
    assert s["worker_threads"] == 32 and s["num_actors"] == 32
    assert s["env_steps"] >= 20_000 and s["updates"] > 0
    assert s["trajectories_produced"] == s["trajectories_consumed"] + s["dropped_trajectories"]
    assert s["gradients_rejected"] == 0


def test_16_worker_processes(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=16, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        s = dask_rl.train(_tiny(), client=client, run_dir=tmp_path / "procs").summary
    assert s["worker_threads"] == 16 and s["num_actors"] == 16
    assert s["env_steps"] >= 20_000 and s["updates"] > 0
    assert s["trajectories_produced"] == s["trajectories_consumed"] + s["dropped_trajectories"]
