"""A shortened soak (bounds asserted) and runs on many workers."""

import sys
from pathlib import Path

import pytest

import dask_rl

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_short_soak_keeps_memory_flat_and_loses_nothing(tmp_path):
    import soak

    data = soak.soak(minutes=0.75, sample_s=3.0, workdir=tmp_path)
    verdict = soak.check(data, max_growth_mb=64.0)
    assert verdict["nothing_lost"], verdict
    assert verdict["memory_flat"], verdict
    assert verdict["no_backlog_growth"], verdict
    assert data["summary"]["trajectories_produced"] > 100


def _tiny():
    return {"stop": {"env_steps": 20_000, "solve_on_target": False, "eval_every_updates": 0},
            "learner": {"max_learners": 8}, "checkpoint": {"every_s": 0}}


@pytest.mark.parametrize("workers, processes", [(32, False), (16, True)],
                         ids=["32-threads-in-process", "16-processes"])
def test_many_workers(workers, processes, tmp_path):
    from distributed import Client, LocalCluster

    # In-process workers share one process: each would compare the whole process's memory
    # (this test session's) with its 1/32 share of the machine and pause. No limit there.
    memory = "auto" if processes else 0
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                      memory_limit=memory, dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        s = dask_rl.train(_tiny(), client=client, run_dir=tmp_path / "many").summary
    assert s["worker_threads"] == workers and s["rollout_slots"] == workers
    assert s["env_steps"] >= 20_000 and s["updates"] > 0
    assert s["trajectories_produced"] == s["trajectories_consumed"] + s["dropped_trajectories"]
    assert s["gradients_rejected"] == 0 and s["recoveries"] == 0
