"""Scheduler housekeeping: what Dask keeps about forgotten work is let go, nothing live is."""

import time

import pytest

from dask_rl.runtime.housekeeping import tidy_scheduler

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _square(x):
    return x * x


def _sleep(s):
    time.sleep(s)
    return s


def _until_forgotten(scheduler, key):
    deadline = time.time() + 5
    while key in scheduler.tasks and time.time() < deadline:
        time.sleep(0.001)


def _task_groups_held(scheduler) -> int:
    """Task groups the scheduler's spans and computations still refer to."""
    spans = scheduler.extensions["spans"].spans.values()
    return (sum(len(sp.groups) for sp in spans)
            + sum(len(c.groups) for c in scheduler.computations))


def test_forgotten_work_is_let_go_and_the_scheduler_keeps_working():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        scheduler = cluster.scheduler
        spans = scheduler.extensions["spans"]
        # dask-rl's pattern: unique keys, submitted one after another, results released
        for i in range(300):
            key = f"learner-{i}-run"
            assert client.submit(_square, i, key=key, pure=False).result() == i * i
            _until_forgotten(scheduler, key)
        # while anything runs the scheduler is never idle: one span takes every submit
        sleeper = client.submit(_sleep, 2.0, pure=False)
        for i in range(50):
            assert client.submit(_square, i, key=f"rollout-{i}-run", pure=False).result() == i * i
        busy = max(spans.spans.values(), key=lambda sp: len(sp.metadata["collections"]))
        assert len(busy.metadata["collections"]) >= 50
        assert sleeper.result() == 2.0
        held = client.submit(_square, 7, key="rollout-held-run", pure=False)
        assert held.result() == 49
        assert len(spans.spans) >= 300 and _task_groups_held(scheduler) >= 300  # Dask keeps

        first = client.run_on_scheduler(tidy_scheduler)
        assert first["task_groups"] >= 300 and first["spans"] == 0  # spans wait out the grace
        assert first["metadata"] >= 49 and len(busy.metadata["collections"]) == 1
        assert _task_groups_held(scheduler) <= 5
        second = client.run_on_scheduler(tidy_scheduler, grace_s=0.0)
        assert second["spans"] >= 299
        assert len(spans.spans) <= 2

        # the live task and its span are untouched; new work and span statistics still work
        assert held.key in scheduler.tasks and held.result() == 49
        group = scheduler.tasks[held.key].group
        assert group.span_id in spans.spans and group in spans.spans[group.span_id].groups
        assert client.submit(_square, 9, pure=False).result() == 81
        assert spans.merge_all().states["memory"] >= 1  # the held result, still counted
        client.run_on_scheduler(tidy_scheduler, grace_s=0.0)
        assert group.span_id in spans.spans and held.result() == 49


@pytest.mark.parametrize("pipeline, overrides", [
    ("ppo_cartpole.yaml", ["stop.env_steps=2048"]),
    ("dqn_cartpole.yaml", ["stop.env_steps=3000", "algo.learning_starts=400"])])
def test_a_run_on_a_users_cluster_leaves_nothing_of_its_own_behind(local_client, pipelines,
                                                                   tmp_path, pipeline,
                                                                   overrides):
    """The cluster outlives the run: its parameter actor, its trajectories and its replay
    buffer are released when the run ends, while the caller still holds the result, not when
    Python's cycle collector next runs (before: DQN left its buffer's trajectories and a
    learner on the scheduler until a gc.collect())."""
    import dask_rl

    result = dask_rl.train(pipelines / pipeline, client=local_client, run_dir=tmp_path / "r",
                           overrides=[*overrides, "checkpoint.every_s=0",
                                      "stop.solve_on_target=false"])
    assert result.summary["env_steps"] > 0

    def tasks():
        return local_client.run_on_scheduler(lambda dask_scheduler: sorted(
            str(k) for k in dask_scheduler.tasks))

    deadline = time.time() + 5
    while tasks() and time.time() < deadline:
        time.sleep(0.05)
    assert tasks() == []
