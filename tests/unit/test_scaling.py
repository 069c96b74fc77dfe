"""The adaptive policy's decisions for scripted backlogs (no cluster)."""

from dask_rl.control.scaling import Bounds, Load, demand, target


def test_idle_runs_shrink_to_the_minimum():
    t = target([], Bounds(minimum=1, maximum=8))
    assert t.workers == 1 and t.reason == "idle"


def test_rollout_backlog_asks_for_threads_up_to_the_maximum():
    load = Load(rollout_running=2, rollout_waiting=4, max_learners=2)
    assert demand(load)[0] == 6
    assert target([load], Bounds(minimum=1, maximum=4)).workers == 4
    assert target([load], Bounds(minimum=1, maximum=16)).workers == 6
    assert target([load], Bounds(minimum=1, maximum=16, threads_per_worker=4)).workers == 2


def test_balance_learners_to_the_actors_throughput():
    # rollouts take 1 s, learning a trajectory takes 0.5 s: 4 actors keep 2 learners busy
    load = Load(rollout_running=4, ready=0, learner_running=1, max_learners=8,
                rollout_s=1.0, learner_s=0.5)
    actors, learners, why = demand(load)
    assert (actors, learners, why) == (4, 2, "balanced")
    assert target([load], Bounds(maximum=100)).workers == 6


def test_when_learners_lag_rollouts_are_cut_to_what_they_absorb():
    # learning takes 4 s per trajectory and 10 trajectories wait: 2 learners absorb 0.5/s,
    # which one actor (1 s per trajectory) already produces
    load = Load(rollout_running=6, ready=10, learner_running=2, max_learners=2,
                rollout_s=1.0, learner_s=4.0)
    actors, learners, why = demand(load)
    assert (actors, learners, why) == (1, 2, "learner-bound")
    assert target([load], Bounds(maximum=100)).workers == 3


def test_gpu_learners_are_sized_in_their_own_group():
    load = Load(rollout_running=8, learner_running=2, ready=1, max_learners=4,
                learners_on_gpu=True)
    t = target([load], Bounds(maximum=100))
    assert t.workers == 8 and t.learner_workers == 3


def test_population_members_add_up_and_other_work_counts():
    members = [Load(rollout_running=1, learner_running=1, max_learners=1) for _ in range(4)]
    assert target(members, Bounds(maximum=100)).workers == 8
    assert target(members, Bounds(maximum=100), other_tasks=3).workers == 11
