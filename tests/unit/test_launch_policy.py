"""The launch policy, driven by scripted events: no cluster, handles are strings."""

import pytest

from dask_rl.control.launch import LaunchPolicy
from dask_rl.control.replay import TrajectoryReplay


def _trajectories(launches):
    return [(launch.trajectory, launch.first_use) for launch in launches.learners]


def test_every_slot_starts_and_learners_are_launched_on_demand():
    p = LaunchPolicy(slots=3, max_learners=2, max_ready=2)
    first = p.decide()
    assert first.rollouts == [0, 1, 2] and first.learners == []
    assert p.decide().rollouts == []          # nothing is idle: nothing more to submit
    p.rollout_done(1, "a")
    d = p.decide()
    assert _trajectories(d) == [("a", True)] and d.learners[0].concurrent == 1
    assert d.rollouts == [1]                  # slot 1 runs again at once: nothing waits


def test_paused_nothing_new_starts_and_what_runs_finishes():
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=4)
    p.decide()
    p.rollout_done(0, "a")
    assert _trajectories(p.decide()) == [("a", True)]
    p.pause()
    p.rollout_done(1, "b")                    # a rollout in flight still lands
    d = p.decide()
    assert d.rollouts == [] and d.learners == [] and list(p.ready) == ["b"]
    p.learner_done(True)                      # the learner in flight still ends
    assert p.learners_in_flight == 0 and not p.finished
    p.resume()
    d = p.decide()
    assert _trajectories(d) == [("b", True)] and d.rollouts == [1]


def test_a_stop_unpauses_so_that_draining_can_finish():
    p = LaunchPolicy(slots=1, max_learners=1, max_ready=2)
    p.decide()
    p.rollout_done(0, "a")
    p.pause()
    p.stop(drain=True)
    assert _trajectories(p.decide()) == [("a", True)]
    p.learner_done(True)
    assert p.finished


def test_learners_are_capped_and_the_rest_wait_ready():
    p = LaunchPolicy(slots=4, max_learners=2, max_ready=8)
    p.decide()
    for slot, name in enumerate("abcd"):
        p.rollout_done(slot, name)
    d = p.decide()
    assert _trajectories(d) == [("a", True), ("b", True)]
    assert [launch.concurrent for launch in d.learners] == [1, 2]
    assert list(p.ready) == ["c", "d"]
    p.learner_done(True)
    assert _trajectories(p.decide()) == [("c", True)]


def test_backpressure_pauses_finished_slots_while_max_ready_wait():
    p = LaunchPolicy(slots=3, max_learners=1, max_ready=2)
    p.decide()
    p.rollout_done(0, "a")
    p.rollout_done(1, "b")
    p.rollout_done(2, "c")
    d = p.decide()                            # "a" goes to the one learner; b, c wait
    assert _trajectories(d) == [("a", True)]
    assert d.rollouts == [] and sorted(p.idle) == [0, 1, 2]
    p.learner_done(True)
    d = p.decide()                            # "b" leaves the queue: one waits, below the cap
    assert _trajectories(d) == [("b", True)] and d.rollouts == [0, 1, 2]


def test_synchronous_rounds_wait_until_everything_collected_is_learned():
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=2, synchronous=True)
    assert p.decide().rollouts == [0, 1]
    p.rollout_done(0, "a")
    d = p.decide()
    assert _trajectories(d) == [("a", True)] and d.rollouts == []  # slot 1 still collecting
    p.rollout_done(1, "b")
    d = p.decide()
    assert _trajectories(d) == [("b", True)] and d.rollouts == []  # learners still running
    p.learner_done(True)
    assert p.decide().rollouts == []
    assert p.learner_done(True) is True       # two learned with two slots: a round ended
    assert p.decide().rollouts == [0, 1]      # the next round starts together


def test_a_round_is_one_trajectory_learned_per_slot():
    p = LaunchPolicy(slots=3, max_learners=3, max_ready=3)
    p.decide()
    for slot, name in enumerate("abc"):
        p.rollout_done(slot, name)
    p.decide()
    assert [p.learner_done(True) for _ in range(3)] == [False, False, True]


def test_slots_grow_and_shrink_with_the_cluster():
    p = LaunchPolicy(slots=2, max_learners=1, max_ready=4)
    p.decide()
    p.resize(4)
    assert p.decide().rollouts == [2, 3]      # new slots start
    p.resize(2)
    p.rollout_done(3, "d")                    # a retired slot's rollout finishes...
    p.rollout_done(0, "a")
    assert p.decide().rollouts == [0]         # ...and is not resubmitted
    p.rollout_failed(2)
    assert p.decide().rollouts == []          # nor after a failure
    with pytest.raises(ValueError):
        p.resize(-1)


def test_a_run_may_start_before_the_cluster_has_workers():
    p = LaunchPolicy(slots=0, max_learners=1, max_ready=1)
    assert p.decide().rollouts == []
    p.resize(2)
    assert p.decide().rollouts == [0, 1]


def test_replay_fills_idle_learners_up_to_k_uses_newest_first():
    replay = TrajectoryReplay(replay=3, capacity=2)
    p = LaunchPolicy(slots=1, max_learners=2, max_ready=1, replay=replay)
    p.decide()
    p.rollout_done(0, "a")
    d = p.decide()
    assert _trajectories(d) == [("a", True), ("a", False)]  # a fresh learner, then a replay
    p.learner_done(True)
    p.learner_done(False)
    p.rollout_done(0, "b")
    assert _trajectories(p.decide()) == [("b", True), ("b", False)]
    p.learner_done(True)
    p.learner_done(False)
    # each has one use left: the newest is replayed first
    assert _trajectories(p.decide()) == [("b", False), ("a", False)]
    p.learner_done(False)
    p.learner_done(False)
    assert p.decide().learners == []          # everything replayed K times


def test_replay_keeps_only_the_newest_trajectories():
    replay = TrajectoryReplay(replay=2, capacity=2)
    for name in "abc":
        replay.add(name)
    assert [h for h, _ in replay.items()] == ["b", "c"]
    assert replay.next() == "c" and replay.next() == "b" and replay.next() is None


def test_replays_are_no_collection_round():
    """A round is one trajectory per slot learned for the first time: with replay 2 the
    strategy's round (Stellaris' decay) comes once per collection round, not twice."""
    p = LaunchPolicy(slots=2, max_learners=1, max_ready=2,
                     replay=TrajectoryReplay(replay=2, capacity=8))
    p.decide()
    p.rollout_done(0, "a")
    p.rollout_done(1, "b")
    ends = []
    for expected in [("a", True), ("b", True), ("b", False), ("a", False)]:
        assert _trajectories(p.decide()) == [expected]
        ends.append(p.learner_done(expected[1]))
    assert ends == [False, True, False, False]


def test_sampled_learners_still_end_rounds():
    """Sampled learners (a replay buffer's batches) learn no trajectory of their own: a round
    is one learner per slot, so the strategy's round end (and its metrics) still come."""
    p = LaunchPolicy(slots=2, max_learners=1, max_ready=2, sampled=True)
    p.decide()
    p.replay_changed(ready=True, behind=False)
    ends = []
    for _ in range(4):
        d = p.decide()
        assert len(d.learners) == 1 and d.learners[0].trajectory is None
        ends.append(p.learner_done(False))
    assert ends == [False, True, False, True]


def test_a_synchronous_round_holds_its_replays_and_its_drain_learns_them():
    replay = TrajectoryReplay(replay=2, capacity=8)
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=2, synchronous=True, replay=replay)
    assert p.decide().rollouts == [0, 1]
    p.rollout_done(0, "a")
    p.rollout_done(1, "b")
    assert _trajectories(p.decide()) == [("a", True), ("b", True)]
    p.learner_done(True)
    d = p.decide()
    assert _trajectories(d) == [("b", False)] and d.rollouts == []  # the round goes on
    p.learner_done(True)
    p.stop(drain=True)
    assert _trajectories(p.decide()) == [("a", False)]  # the round's last replay, draining
    p.learner_done(False)
    assert not p.finished                      # b's replay still running
    p.learner_done(False)
    assert p.decide().learners == [] and p.finished


def test_no_replay_once_stopping_and_draining_learns_everything_collected():
    replay = TrajectoryReplay(replay=4, capacity=4)
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=2, replay=replay)
    p.decide()
    p.rollout_done(0, "a")
    p.stop(drain=True)
    d = p.decide()
    assert _trajectories(d) == [("a", True)] and d.rollouts == []   # no replay, no rollouts
    assert not p.finished                      # slot 1 still collecting, a learner running
    p.rollout_done(1, "b")
    assert _trajectories(p.decide()) == [("b", True)]
    p.learner_done(True)
    assert not p.finished
    p.learner_done(True)
    assert p.finished


def test_a_stop_without_draining_finishes_at_once():
    p = LaunchPolicy(slots=2, max_learners=1, max_ready=1)
    p.decide()
    assert not p.finished
    p.rollout_done(0, "a")
    p.stop(drain=False)
    assert p.finished
    d = p.decide()   # nothing more starts: the policy that stopped the run is the one kept
    assert d.learners == [] and d.rollouts == []


def test_discarding_counts_what_is_thrown_away_and_frees_the_slots():
    replay = TrajectoryReplay(replay=2, capacity=4)
    p = LaunchPolicy(slots=3, max_learners=1, max_ready=1, replay=replay)
    p.decide()
    p.rollout_done(0, "a")
    p.rollout_done(1, "b")
    d = p.decide()                             # a: learner in flight; b: ready; slot 2 running
    assert d.rollouts == []                    # (b waiting holds slots 0 and 1 back)
    gone = p.discard_all()
    assert gone.trajectories == 2              # b never learned, a's first learner cancelled
    assert gone.rollouts == 1                  # slot 2 was collecting
    assert len(replay) == 0 and not p.ready
    assert p.decide().rollouts == [0, 1, 2]    # every slot starts again


def test_a_replayed_learner_lost_costs_no_trajectory():
    replay = TrajectoryReplay(replay=2, capacity=4)
    p = LaunchPolicy(slots=1, max_learners=2, max_ready=1, replay=replay)
    p.decide()
    p.rollout_done(0, "a")
    p.decide()                                 # "a" fresh and "a" replayed
    p.learner_failed(False)
    assert p.discard_all().trajectories == 1   # only the first use counts


def test_sampled_learners_run_while_the_buffer_is_ready_and_rollouts_never_wait():
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=1, sampled=True)
    assert p.decide().rollouts == [0, 1]
    p.rollout_done(0, "a")
    p.rollout_done(1, "b")
    d = p.decide()
    assert d.learners == [] and list(p.ready) == []      # the caller keeps them
    assert sorted(d.rollouts) == [0, 1]                  # no backpressure: nothing is ready
    p.replay_changed(ready=True, behind=False)
    d = p.decide()
    assert [(x.trajectory, x.first_use, x.concurrent) for x in d.learners] == \
        [(None, False, 1), (None, False, 2)]
    assert p.decide().learners == []                     # two at most
    p.learner_done(False)
    assert len(p.decide().learners) == 1                 # one ended, one more starts
    p.stop(drain=True)
    assert p.decide().learners == [] and not p.finished  # none once stopping; two still run
    p.learner_done(False)
    p.learner_done(False)
    p.rollout_done(0, "c")
    p.rollout_done(1, "d")
    assert p.finished


def test_sampled_rollouts_wait_only_while_the_learners_are_behind():
    p = LaunchPolicy(slots=1, max_learners=1, max_ready=1, sampled=True)
    assert p.decide().rollouts == [0]
    p.rollout_done(0, "a")
    p.replay_changed(ready=True, behind=True)      # the replay ratio says: learn first
    d = p.decide()
    assert d.rollouts == [] and len(d.learners) == 1
    p.learner_done(False)
    p.replay_changed(ready=True, behind=False)     # caught up: collect again
    assert p.decide().rollouts == [0]


# ---- learners fed where the data is (fused launches) ------------------------------------------
def _fused(launches):
    return [(f.slot, f.queued) for f in launches.fused]


def test_fused_each_running_slot_gets_one_launch_queued_behind_it():
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=2, fused=True)
    d = p.decide()
    assert _fused(d) == [(0, False), (0, True), (1, False), (1, True)]
    assert d.rollouts == [] and d.learners == []
    assert p.decide().fused == []             # every slot has its task and its queued one
    assert p.learners_in_flight == 4 and p.rollouts_in_flight == 4
    assert not p.fused_done(0)                # slot 0's queued task now runs: queue another
    assert _fused(p.decide()) == [(0, True)]
    assert p.fused_done(1)                    # two learned, one per slot: a round
    assert not p.fused_done(0) and p.learned == 3


def test_fused_running_slots_never_exceed_max_learners():
    """At most max_learners slots run a task at once, so no more learners are ever active
    than that; the queued launches wait behind them, they do not run beside them."""
    p = LaunchPolicy(slots=3, max_learners=2, max_ready=2, fused=True)
    assert _fused(p.decide()) == [(0, False), (0, True), (1, False), (1, True)]
    p.fused_done(0)
    p.fused_done(0)                           # slot 0 is idle: slot 2 may start
    assert _fused(p.decide()) == [(2, False), (2, True)]
    assert len(p.running_slots) == 2
    for _ in range(2):
        p.fused_done(1)
    assert _fused(p.decide()) == [(0, False), (0, True)]


def test_fused_without_lookahead_and_synchronous_rounds_queue_nothing():
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=2, fused=True, lookahead=0)
    assert _fused(p.decide()) == [(0, False), (1, False)]
    s = LaunchPolicy(slots=2, max_learners=2, max_ready=2, fused=True, synchronous=True)
    assert _fused(s.decide()) == [(0, False), (1, False)]
    s.fused_done(0)
    assert s.decide().fused == []             # the round waits for slot 1's task
    assert s.fused_done(1)                    # the round: one trajectory per slot learned
    assert _fused(s.decide()) == [(0, False), (1, False)]


def test_fused_pause_stop_failure_and_discard():
    p = LaunchPolicy(slots=1, max_learners=1, max_ready=1, fused=True)
    p.decide()
    p.pause()
    p.fused_done(0)
    assert p.decide().fused == [] and p.learners_in_flight == 1   # the queued one still runs
    p.fused_failed(0)
    assert p.learners_in_flight == 0 and p.idle == [0]
    p.resume()
    assert _fused(p.decide()) == [(0, False), (0, True)]
    gone = p.discard_all()
    assert (gone.rollouts, gone.trajectories) == (2, 0) and p.idle == [0]
    p.stop(drain=True)
    assert p.decide().fused == [] and p.finished


def test_fused_refuses_replay():
    with pytest.raises(ValueError, match="fused"):
        LaunchPolicy(slots=1, max_learners=1, max_ready=1, fused=True, sampled=True)


def test_a_grown_slot_whose_old_task_still_runs_is_not_started_twice():
    p = LaunchPolicy(slots=2, max_learners=2, max_ready=2)
    assert p.decide().rollouts == [0, 1]
    p.resize(1)
    p.resize(2)                               # slot 1's old rollout is still running
    assert p.decide().rollouts == []
    p.rollout_done(1, "b")
    assert p.decide().rollouts == [1]


def test_fused_runs_apart_when_there_are_more_slots_than_learners():
    # a fused slot stays busy, so slots beyond max_learners would never start and a sync
    # round would hold fewer than all slots: with 4 slots and 2 learners, tasks are apart
    p = LaunchPolicy(slots=0, max_learners=2, max_ready=2, fused=True)
    p.resize(4)
    launches = p.decide()
    assert not launches.fused and sorted(launches.rollouts) == [0, 1, 2, 3]
    q = LaunchPolicy(slots=0, max_learners=2, max_ready=2, fused=True, synchronous=True)
    q.resize(2)
    assert sorted(f.slot for f in q.decide().fused) == [0, 1]
