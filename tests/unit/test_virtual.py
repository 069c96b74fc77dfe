"""The virtual-time cluster (dask_rl.virtual): the order of events a cluster would produce.

The references are worked out by hand from the cluster's rules (a slot's rollout pulls when
it starts, a learner pulls when it starts and pushes when it ends, async applies each push on
arrival, a fused slot's queued task starts when its running one ends), per push, for fixed
task times; the mechanisms (SSP's read gate, sync's barrier, the stop) are checked on the
records of every push, not on the emulator's own counters alone.
"""

import json

import numpy as np
import pytest

from dask_rl.cli import main
from dask_rl.config import ConfigError, load_pipeline
from dask_rl.virtual import TaskTime, VirtualCluster, _Clock


def _cfg(pipelines, *overrides, name="ppo_cartpole.yaml"):
    return load_pipeline(pipelines / name, ["stop.env_steps=20000", *overrides])


def _run(cfg, slots=4, rollout=TaskTime(1.0), learn=TaskTime(1.0), seed=0, cores=None):
    return VirtualCluster(cfg, slots=slots, rollout_time=rollout, learn_time=learn,
                          seed=seed, cores=cores).run()


def test_async_apart_reaches_the_staleness_of_its_learners(pipelines):
    """4 slots, 4 learners apart from their rollouts, every task 1 s. t=1: the 4 rollouts
    (version 0) go to 4 learners pulling version 0 and the slots collect again with version 0.
    t=2: the pushes land one after another (staleness 0, 1, 2, 3), each followed by its slot's
    next trajectory, whose learner pulls the version that push made (1, 2, 3, 4: lags 1 to
    4). From t=3 on every push is 3 versions stale and each trajectory 4 versions old."""
    r = _run(_cfg(pipelines, "learner.max_learners=4", "learner.fused=false"))
    pushes = r["pushes"]
    assert not r["cluster"]["fused"]
    assert [p["staleness"] for p in pushes[:12]] == [0, 1, 2, 3] + [3] * 8
    assert [p["policy_lag"] for p in pushes[:12]] == [0, 0, 0, 0, 1, 2, 3, 4] + [4] * 4
    assert [p["t"] for p in pushes[:8]] == [2.0] * 4 + [3.0] * 4
    assert all(p["status"] == "applied" for p in pushes)


def test_fused_slots_collect_again_while_their_last_learner_learns(pipelines):
    """The same cluster fused (collect and learn in one task, one queued behind each slot;
    the slot's environments are held for the collection only). t=0: slot k's task A collects
    with version 0. t=1: A pulls version 0 and the queued task B collects with version 0.
    t=2 (ties in the order they were scheduled): B0 has collected and pulls version 0, A0
    pushes (staleness 0, version 1), the new queued C0 collects; B1 pulls 1, A1 pushes
    (staleness 1); ... so A's pushes are 0..3 stale and B_k pulled version k. t=3: B_k
    pushes, each 4 versions stale (version 4 + k when it lands), its trajectory k versions
    older than its pull."""
    r = _run(_cfg(pipelines, "learner.max_learners=4"))
    pushes = r["pushes"]
    assert r["cluster"]["fused"]
    assert [p["staleness"] for p in pushes[:8]] == [0, 1, 2, 3, 4, 4, 4, 4]
    assert [p["policy_lag"] for p in pushes[:8]] == [0, 0, 0, 0, 0, 1, 2, 3]
    assert [p["version_pulled"] for p in pushes[:8]] == [0, 0, 0, 0, 0, 1, 2, 3]
    assert [p["t"] for p in pushes[:8]] == [2.0] * 4 + [3.0] * 4


@pytest.mark.parametrize("fused", ["true", "false"])
def test_sync_rounds_hold_the_barrier(pipelines, fused):
    """Sync: one update per round, every gradient of round k computed on version k from
    trajectories collected with version k, whatever the task times."""
    r = _run(_cfg(pipelines, "aggregation.strategy=sync", "learner.max_learners=4",
                  f"learner.fused={fused}"),
             rollout=TaskTime(1.0, 0.8), learn=TaskTime(0.5, 0.8))
    pushes, s = r["pushes"], r["summary"]
    assert s["updates"] == s["rounds"] == len(pushes) // 4
    assert all(p["staleness"] == 0 and p["policy_lag"] == 0 for p in pushes)
    assert [p["version_pulled"] for p in pushes] == [i // 4 for i in range(len(pushes))]
    # the barrier held: round k+1's first pull comes after round k's last push
    for k in range(1, s["rounds"]):
        assert (min(p["pulled_at"] for p in pushes[4 * k:4 * k + 4])
                >= max(p["t"] for p in pushes[4 * k - 4:4 * k]))


def test_ssp_read_gate_waits_until_the_slowest_learner_pushes(pipelines):
    """SSP with bound 0: a learner may pull only while every learner computing holds the
    current version. Checked on the records: whenever a learner pulled, every other learner
    computing at that moment had pulled the same version; and learners did wait (async,
    with the same task times, never does)."""
    times = dict(rollout=TaskTime(0.3, 0.8), learn=TaskTime(1.0, 0.8))
    ssp = _run(_cfg(pipelines, "aggregation.strategy=ssp", "aggregation.bound=0",
                    "learner.max_learners=4", "learner.fused=false"), **times)
    pushes = ssp["pushes"]
    for j in pushes:
        for i in pushes:
            if i is not j and i["pulled_at"] < j["pulled_at"] < i["t"]:
                assert i["version_pulled"] == j["version_pulled"], (i, j)
    assert sum(p["admission_wait"] > 0 for p in pushes) >= 5
    assert ssp["actor"]["ssp/refused_reads"] > 0
    plain = _run(_cfg(pipelines, "learner.max_learners=4", "learner.fused=false"), **times)
    assert all(p["admission_wait"] == 0 for p in plain["pushes"])
    assert max(p["staleness"] for p in plain["pushes"]) > 0


def test_the_same_seeds_give_the_same_run_and_another_seed_another(pipelines):
    cfg = _cfg(pipelines, "learner.max_learners=3", "stop.env_steps=6000")
    times = dict(rollout=TaskTime(1.0, 0.5), learn=TaskTime(1.0, 0.5))
    a, b = _run(cfg, **times), _run(cfg, **times)
    real_seconds = {"learn_s", "cross_forward_s", "cross_exchange_s"}

    def virtual(run):
        return [{k: v for k, v in p.items() if k not in real_seconds} for p in run["pushes"]]

    assert virtual(a) == virtual(b)
    c = _run(cfg, seed=1, **times)
    assert [p["t"] for p in c["pushes"]] != [p["t"] for p in a["pushes"]]


def test_a_virtual_wall_budget_stops_rollouts_and_lets_learners_end(pipelines):
    """stop.wall_s is virtual time: no task starts after it, the rollouts in flight are
    dropped, the learners in flight push."""
    r = _run(_cfg(pipelines, "learner.max_learners=2", "learner.fused=false",
                  "stop.wall_s=5.5"), slots=4, rollout=TaskTime(1.0), learn=TaskTime(1.0))
    pushes = r["pushes"]
    assert max(p["pulled_at"] for p in pushes) <= 5.5
    assert max(p["t"] for p in pushes) <= 6.5
    assert r["summary"]["dropped_rollouts"] > 0
    assert r["summary"]["env_steps"] < 20000


def test_the_wall_budget_stops_at_its_moment_not_at_the_next_task(pipelines):
    """Every task takes 1 s, so tasks end on whole seconds; the budget is 5.5 s. The stop
    comes at 5.5 exactly: every rollout that ends later (at 6) is dropped, every one that
    ended before is collected, and the env steps collected are those rollouts'."""
    cfg = _cfg(pipelines, "learner.max_learners=2", "learner.fused=false", "stop.wall_s=5.5")
    r = _run(cfg, slots=4)
    s, rollouts = r["summary"], r["rollouts"]
    assert (s["stop_reason"], s["stopped_at"]) == ("wall_s", 5.5)
    late = [x for x in rollouts if x["ended"] > 5.5]
    assert late and {x["ended"] for x in late} == {6.0}
    assert {x["status"] for x in late} == {"dropped"}
    assert {x["status"] for x in rollouts if x["ended"] <= 5.5} == {"collected"}
    collected = sum(x["status"] == "collected" for x in rollouts)
    assert s["env_steps_collected"] == collected * cfg.batch_size
    assert s["dropped_rollouts"] == len(late)


def test_a_stop_without_drain_waits_for_learners_as_long_as_the_driver(pipelines):
    """After the wall budget the driver waits LEARNER_DRAIN_S (60 s) for learners in flight:
    learners of 30 s push, learners of 100 s are abandoned at 5.5 + 60 s."""
    cfg = _cfg(pipelines, "learner.max_learners=2", "learner.fused=false", "stop.wall_s=5.5")
    short = _run(cfg, slots=4, learn=TaskTime(30.0))
    assert short["summary"]["abandoned"] == 0
    assert max(p["t"] for p in short["pushes"]) > 5.5
    long = _run(cfg, slots=4, learn=TaskTime(100.0))
    assert long["summary"]["abandoned"] == 2            # the two learners in flight
    assert long["summary"]["virtual_s"] == pytest.approx(65.5)
    assert all(p["t"] <= 5.5 for p in long["pushes"])


@pytest.mark.parametrize("learned, collected, now, reason, drain", [
    (6000, 6000, 9.0, "env_steps", True),     # learned comes first, even past the wall
    (5000, 6000, 9.0, "wall_s", False),       # the wall comes before collected
    (5000, 6000, 1.0, "env_steps", True),     # collected, before the wall
    (5000, 5000, 1.0, None, False),
])
def test_the_stop_takes_the_drivers_order(pipelines, learned, collected, now, reason, drain):
    cfg = _cfg(pipelines, "stop.env_steps=6000", "stop.wall_s=5")
    vc = VirtualCluster(cfg, slots=2, rollout_time=TaskTime(1.0), learn_time=TaskTime(1.0))
    vc.env_steps, vc.collected, vc.clock.now = learned, collected, now
    vc._check_stop()
    assert vc.stop_reason == reason
    assert vc.policy.stopping == (reason is not None)
    assert vc.policy.draining == drain


def test_impact_replays_each_trajectory_and_rounds_count_first_uses(pipelines):
    """IMPACT with replay 2 on one slot and two learners, every task 1 s: each trajectory is
    learned when it arrives and once more beside it (the last one's replay is cut by the
    stop); env steps and Stellaris' rounds (beta's decay) count first uses only."""
    cfg = load_pipeline(pipelines / "impact_cartpole.yaml",
                        ["stop.env_steps=4000", "learner.max_learners=2"])
    r = _run(cfg, slots=1)
    first = [p for p in r["pushes"] if p["first_use"]]
    replays = [p for p in r["pushes"] if not p["first_use"]]
    assert len(first) == 8 and len(replays) == 7
    assert r["summary"]["env_steps"] == len(first) * cfg.batch_size
    assert r["summary"]["rounds"] == r["actor"]["round"] == len(first)
    for replay in replays:      # learned beside the next trajectory's first use, same pull
        twin = [p for p in first if p["t"] == replay["t"]]
        assert twin and twin[0]["version_pulled"] == replay["version_pulled"]


def test_env_step_budget_drains_what_was_collected(pipelines):
    r = _run(_cfg(pipelines, "learner.max_learners=2", "stop.env_steps=5000"), slots=4)
    s = r["summary"]
    assert s["env_steps"] >= 5000
    assert s["env_steps"] == s["env_steps_collected"]   # everything collected was learned
    assert r["config"]["stop"]["env_steps"] == 5000
    assert r["cluster"]["rollout_time"] == {"kind": "fixed", "mean": 1.0, "sigma": 0.0}


def test_shared_cores_divide_the_work_of_what_runs():
    """Processor sharing on 1 core: tasks of work 1 and 2 start at 0 and run at half speed;
    the first is done at 2, the second alone then at full speed, done at 3. On 2 cores two
    tasks share nothing: work 3 from 0 and work 1 from 2.5 end at 3 and 3.5."""
    ended = []
    clock = _Clock(cores=1)
    clock.at(1.0, ended.append, "a")
    clock.at(2.0, ended.append, "b")
    while clock.busy:
        action, args = clock.next()
        action(*args)
        ended.append(clock.now)
    assert ended == ["a", 2.0, "b", 3.0]
    two = _Clock(cores=2)
    two.at(3.0, ended.append, "c")
    two.now = 2.5     # as if another task had ended then
    two.at(1.0, ended.append, "d")
    assert two.next()[1] == ("c",) and two.now == pytest.approx(3.0)
    assert two.next()[1] == ("d",) and two.now == pytest.approx(3.5)


def test_on_shared_cores_equal_learners_push_in_the_order_they_pulled(pipelines):
    """With equal work and shared cores no learner overtakes another (they progress at the
    same rate), so versions pulled rise push by push and async staleness stays below the
    learners; with own cores and spread-out times learners overtake each other."""
    cfg = _cfg(pipelines, "learner.max_learners=3", "learner.fused=false",
               "stop.env_steps=12000")
    shared = _run(cfg, cores=2)
    pulled = [p["version_pulled"] for p in shared["pushes"]]
    assert pulled == sorted(pulled)
    assert max(p["staleness"] for p in shared["pushes"]) <= 2
    assert shared["cluster"]["cores"] == 2
    # 4 rollouts and up to 3 learners share 2 cores: every task runs slower than alone
    own = _run(cfg)
    assert shared["summary"]["virtual_s"] > 2 * own["summary"]["virtual_s"]
    spread = _run(cfg, learn=TaskTime(1.0, 1.0))
    pulled = [p["version_pulled"] for p in spread["pushes"]]
    assert pulled != sorted(pulled)


def test_task_times():
    rng = np.random.default_rng(0)
    draws = [TaskTime(2.0, 0.8).draw(rng) for _ in range(40000)]
    assert np.mean(draws) == pytest.approx(2.0, rel=0.03)
    assert np.std(np.log(draws)) == pytest.approx(0.8, rel=0.03)
    assert TaskTime.parse("0.5:0.2") == TaskTime(0.5, 0.2)
    measured = TaskTime.measured([0.1, 0.3], scale=10)
    assert {measured.draw(rng) for _ in range(50)} == {1.0, 3.0}
    assert measured.describe()["n"] == 2
    for bad in ("x", "0", "1:-1"):
        with pytest.raises(ConfigError):
            TaskTime.parse(bad)


@pytest.mark.parametrize("name, overrides, message", [
    ("dqn_cartpole.yaml", [], "does not emulate sampled replay learners"),
    ("es_cartpole.yaml", [], "runs gradient learners without a population"),
    ("pbt_cartpole.yaml", [], "without a population, got 'ppo' with population"),
    ("ppo_cartpole.yaml", ["--set", "learner.optimizer_state=local"], "optimizer_state"),
    ("ppo_cartpole.yaml", ["--set", "cluster.adapt.maximum=4"], "cluster.adapt"),
    ("ppo_cartpole.yaml", ["--rollout-s", "-1"], "a task time needs mean > 0"),
    ("ppo_cartpole.yaml", ["--learners", "0"], "--learners: must be >= 1"),
])
def test_emulate_refuses_with_one_line(pipelines, capsys, name, overrides, message):
    args = ["emulate", str(pipelines / name), "--slots", "4", "--rollout-s", "1",
            "--learn-s", "1", *overrides]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_emulate_writes_the_run(pipelines, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["emulate", str(pipelines / "ppo_cartpole_stellaris.yaml"), "--slots", "16",
                 "--learners", "8", "--rollout-s", "1:0.5", "--learn-s", "2:0.5",
                 "--set", "stop.env_steps=12000", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["config"]["aggregation"]["strategy"] == "stellaris"
    assert r["config"]["learner"]["max_learners"] == 8
    assert r["cluster"]["slots"] == 16 and r["cluster"]["learn_time"]["sigma"] == 0.5
    assert len(r["pushes"]) == r["summary"]["staleness"]["n"]
    assert r["summary"]["staleness"]["max"] >= 4      # 8 learners in flight
    assert json.loads(capsys.readouterr().out)["env_steps"] >= 12000
