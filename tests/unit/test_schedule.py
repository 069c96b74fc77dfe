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


def test_a_confirmation_must_predict_a_fresh_standard_evaluation_reaching_the_target():
    # the gap between a 300-episode mean and a fresh 100-episode one has the standard error
    # std * sqrt(1/300 + 1/100) = std * 0.11547: at std 40 that is 4.619, so 3.5 of them put
    # the bar at 475 + 16.17 = 491.17
    kw = {"episodes": 300, "target": 475.0, "standard_episodes": 100}
    assert not target_confirmed(mean=491.1, std=40.0, margin=3.5, **kw)
    assert target_confirmed(mean=491.2, std=40.0, margin=3.5, **kw)
    # the suite's seed 12 (489.4 +- 31.5, then 474.3 on 100 fresh episodes): 100 episodes at
    # the old 4 standard errors passed it (bar 487.6); the gap's bar is 475 + 3.5 * 31.5 *
    # sqrt(2) / 10 = 490.6
    assert not target_confirmed(mean=489.4, std=31.5, margin=3.5,
                                **{**kw, "episodes": 100})
    assert target_confirmed(mean=478.3, std=50.1, margin=0.0, **kw)      # the bare standard
    assert target_confirmed(mean=500.0, std=0.0, margin=3.5, **kw)       # every episode 500
    assert not target_confirmed(mean=474.9, std=0.0, margin=0.0, **kw)
    # a longer confirmation of the same mean and spread passes where a shorter one does not
    assert target_confirmed(mean=489.0, std=30.0, margin=3.5, **{**kw, "episodes": 1000})
    assert not target_confirmed(mean=489.0, std=30.0, margin=3.5, **{**kw, "episodes": 100})


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
