"""The adaptive policy's decisions for scripted backlogs (no cluster)."""

from dask_rl.control.scaling import Bounds, Load, demand, lp_allocation, target


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


def test_tianji_allocation_balances_the_two_throughputs_on_every_thread():
    # rollouts take 1 s, learning a trajectory 3 s, 8 threads: n_L / 3 = n_A and n_L + n_A = 8
    # give 6 learners and 2 actors, 2 trajectories/s each side (the LP optimum, by hand)
    load = Load(rollout_s=1.0, learner_s=3.0, max_learners=8, max_threads=8)
    a = lp_allocation(load)
    assert a is not None
    assert (a.learners, a.actors, a.bound) == (6, 2, "balance")
    assert a.throughput == 2.0


def test_tianji_allocation_under_the_staleness_bound_takes_the_fewest_actors():
    # at most 2 learners: they absorb 2/3 trajectory/s, which one actor (1/s) already covers;
    # more actors would only queue trajectories
    a = lp_allocation(Load(rollout_s=1.0, learner_s=3.0, max_learners=2, max_threads=8))
    assert a is not None
    assert (a.learners, a.actors, a.bound) == (2, 1, "staleness")


def test_no_allocation_until_both_times_and_the_size_limit_are_known():
    assert lp_allocation(Load(rollout_s=0.0, learner_s=3.0, max_threads=8)) is None
    assert lp_allocation(Load(rollout_s=1.0, learner_s=0.0, max_threads=8)) is None
    assert lp_allocation(Load(rollout_s=1.0, learner_s=3.0, max_threads=0)) is None
    assert lp_allocation(Load(rollout_s=1.0, learner_s=3.0, max_threads=8,
                              learners_on_gpu=True)) is None


def test_a_reported_allocation_replaces_the_backlog_rules():
    # the backlog alone would ask for 6 rollouts and 2 learners; the driver's allocation wins
    load = Load(rollout_running=6, ready=10, learner_running=2, max_learners=2,
                rollout_s=1.0, learner_s=4.0, lp_actors=1, lp_learners=2, lp_bound="staleness")
    assert demand(load) == (1, 2, "lp-staleness")
    t = target([load, load], Bounds(maximum=100))
    assert t.workers == 6 and t.reason == "lp-staleness"
