"""The run's small decisions: evaluation schedule, learning-rate annealing, accounting."""

import json

import pytest

from dask_rl.control.accounting import Accounting, ema
from dask_rl.control.schedule import (
    EvalSchedule,
    learner_seed,
    learning_rate,
    target_confirmed,
)


def test_evaluations_come_every_n_updates_one_at_a_time():
    s = EvalSchedule(every_updates=50, target=None)
    due = [u for u in range(0, 200, 10)
           if s.due(updates=u, recent_return=None, recent_episodes=0, running=False)]
    assert due == [50, 100, 150]
    assert not s.due(updates=200, recent_return=None, recent_episodes=0, running=True)
    assert s.due(updates=200, recent_return=None, recent_episodes=0, running=False)


def test_an_evaluation_comes_when_the_training_return_reaches_the_target():
    s = EvalSchedule(every_updates=0, target=475.0)
    assert not s.due(updates=3, recent_return=480.0, recent_episodes=4, running=False)
    assert s.due(updates=3, recent_return=480.0, recent_episodes=5, running=False)
    assert not s.due(updates=3, recent_return=480.0, recent_episodes=5, running=False)
    assert not s.due(updates=4, recent_return=400.0, recent_episodes=20, running=False)
    s.reset()  # after a recovery the same version is evaluated again
    assert s.due(updates=3, recent_return=480.0, recent_episodes=5, running=False)


def test_after_an_unconfirmed_target_the_recent_return_alone_waits_a_period():
    s = EvalSchedule(every_updates=50, target=475.0)
    assert s.due(updates=7, recent_return=490.0, recent_episodes=20, running=False)
    s.hold_target(7)
    held = [u for u in range(8, 70)
            if s.due(updates=u, recent_return=490.0, recent_episodes=20, running=False)]
    assert held[0] == 57   # the first update count at least 50 past the unconfirmed one


def test_a_resumed_schedule_evaluates_when_the_uninterrupted_one_would():
    def due(s, updates, recent_return=100.0):
        return [u for u in updates if s.due(updates=u, recent_return=recent_return,
                                            recent_episodes=20, running=False)]

    def through_a_checkpoint(s):
        resumed = EvalSchedule(every_updates=50, target=475.0)
        resumed.load_state(json.loads(json.dumps({"learner_seq": 3, **s.state()})))
        return resumed

    whole = EvalSchedule(every_updates=50, target=475.0)
    assert due(whole, range(0, 240, 3)) == [51, 102, 153, 204]
    first = EvalSchedule(every_updates=50, target=475.0)
    assert due(first, range(0, 120, 3)) == [51, 102]
    # not at the resumed run's first update (120): on at 153 and 204, as without the pause
    assert due(through_a_checkpoint(first), range(120, 240, 3)) == [153, 204]

    held = EvalSchedule(every_updates=50, target=475.0)
    assert due(held, [110], recent_return=490.0) == [110]
    held.hold_target(110)   # not confirmed: the recent return alone waits until 160
    assert due(through_a_checkpoint(held), [120, 159, 160], recent_return=490.0) == [160]

    # a checkpoint written before the schedule was kept: evaluate at the next update
    old = EvalSchedule(every_updates=50, target=None)
    old.load_state({"learner_seq": 3})
    assert due(old, [120, 123]) == [120]


def test_a_confirmation_must_clear_the_target_by_its_margin():
    # a seed of the main job in CI: 478.3 +- 50.1 over 100 episodes, then 471.9 on 100 fresh
    # episodes. Its standard error is 5.0: 2.5 of them put the bar at 487.5, not passed
    kw = {"episodes": 100, "target": 475.0}
    assert not target_confirmed(mean=478.3, std=50.1, margin=2.5, **kw)
    assert target_confirmed(mean=478.3, std=50.1, margin=0.0, **kw)      # the bare standard
    assert target_confirmed(mean=496.0, std=20.0, margin=2.5, **kw)      # 496 - 5 = 491
    assert target_confirmed(mean=500.0, std=0.0, margin=2.5, **kw)       # every episode 500
    assert not target_confirmed(mean=474.9, std=0.0, margin=0.0, **kw)


def test_learning_rate_anneals_linearly_to_a_floor():
    assert learning_rate(1e-3, anneal=False, env_steps=900, total_env_steps=1000) == 1e-3
    assert learning_rate(1e-3, anneal=True, env_steps=250, total_env_steps=1000) == \
        pytest.approx(0.75e-3)
    assert learning_rate(1e-3, anneal=True, env_steps=2000, total_env_steps=1000) == \
        pytest.approx(1e-5)


def test_learner_seeds_differ_per_task_and_repeat_per_run():
    assert learner_seed(1, 5) == learner_seed(1, 5)
    assert len({learner_seed(1, i) for i in range(100)}) == 100
    assert learner_seed(1, 5) != learner_seed(2, 5)


def test_accounting_counts_a_replay_once():
    a = Accounting()
    a.rollout_finished(512)
    a.learner_finished(first_use=True, task_s=0.2, collect_s=0.1, trajectory_bytes=100)
    a.learner_finished(first_use=False, task_s=0.4, collect_s=0.1, trajectory_bytes=100)
    assert a.trajectories_produced == a.trajectories_consumed == 1
    assert a.trajectory_bytes == 100 and a.rollout_busy_s == pytest.approx(0.1)
    assert a.learner_busy_s == pytest.approx(0.6)
    assert a.learner_s == pytest.approx(0.8 * 0.2 + 0.2 * 0.4)
    assert ema(0.0, 3.0) == 3.0
