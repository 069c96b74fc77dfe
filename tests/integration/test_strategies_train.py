"""Learning with the staleness-aware strategies and the off-policy learner, 2 workers.

Each strategy's test asserts its mechanism on a real cluster, not only that CartPole was
solved (CartPole forgives almost anything): the barrier held, the gate waited, the threshold
followed its schedule, the truncation changed ratios, the read gate kept its bound.
"""

import collections
import threading
import time

import pytest

import dask_rl
from dask_rl.checkpoint import CheckpointStore
from dask_rl.data.metrics import read_metrics

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _records(run_dir, kind):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


def test_stellaris_solves_cartpole(local_client, pipelines, tmp_path):
    run = tmp_path / "stellaris"
    result = dask_rl.train(pipelines / "ppo_cartpole_stellaris.yaml", client=local_client,
                           run_dir=run)
    s = result.summary
    assert s["solved"] and s["final_return"] >= 475, s
    assert s["strategy"] == "stellaris"
    rounds = _records(run, "round")
    for key in ("staleness/mean", "staleness/max", "staleness/histogram", "gradients/applied",
                "gradients/buffered", "gradients/dropped", "learners/active", "lr_scale",
                "threshold/beta", "threshold/waits"):
        assert key in rounds[-1], key
    learners = _records(run, "learner")
    assert all(r["status"] in ("applied", "buffered", "dropped") for r in learners)


def test_stellaris_gate_threshold_and_truncation_at_work(pipelines, tmp_path):
    """4 learners on 2 workers x 2 threads, a fixed budget: enough overlap that stale gradients
    meet computing learners, so the gate has something to hold back."""
    from distributed import Client, LocalCluster

    run = tmp_path / "stellaris"
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        dask_rl.train(pipelines / "ppo_cartpole_stellaris.yaml", client=client, run_dir=run,
                      overrides=["stop.env_steps=100000", "stop.solve_on_target=false",
                                 "stop.eval_every_updates=0", "checkpoint.every_s=0"])
    rounds = _records(run, "round")
    # the gate held stale gradients back, and released updates on the threshold
    assert rounds[-1]["threshold/waits"] > 0
    assert rounds[-1]["threshold/released_below"] > 0
    learners = _records(run, "learner")
    assert any(r["status"] == "buffered" for r in learners)
    # beta_k = max(delta_max d^k, floor) from the first stale round on
    decayed = [r for r in rounds if r["threshold/delta_max"] is not None]
    assert len(decayed) >= 5
    delta_max, d = decayed[0]["threshold/delta_max"], decayed[0]["threshold/decay"]
    for k, r in enumerate(decayed):
        assert r["threshold/beta"] == pytest.approx(max(delta_max * d ** k, 1.0)), k
    # global IS truncation saw other learners' current policies and changed some weights
    assert max(r["cross_policies"] for r in learners) > 0
    assert max(r.get("losses/is_truncated_frac", 0) for r in learners) > 0


def test_impact_solves_cartpole_with_stellaris(local_client, pipelines, tmp_path):
    run = tmp_path / "impact"
    result = dask_rl.train(pipelines / "impact_cartpole.yaml", client=local_client,
                           run_dir=run, overrides=["env.normalize_obs=true"])
    s = result.summary
    assert s["algorithm"] == "impact" and s["strategy"] == "stellaris"
    assert s["solved"] and s["final_return"] >= 475, s
    learners = _records(run, "learner")
    assert any(r["replay"] for r in learners), "the circular buffer never replayed a batch"
    assert all("losses/target_weight" in r for r in learners)
    # replays learn from the same steps again but add no observation statistics
    state, _ = CheckpointStore(run / "checkpoints").load()
    assert state["actor"]["moments"]["obs"][0] == s["env_steps"]


def test_sync_updates_aggregate_exactly_one_round_with_no_staleness(local_client, tmp_path):
    """50+ rounds of 4 learners: each update holds the 4 gradients of one round, all fresh."""
    run = tmp_path / "sync"
    result = dask_rl.train(
        {"aggregation": {"strategy": "sync"}, "env": {"num_envs": 2}, "rollout": {"steps": 64,
         "slots": 4}, "learner": {"max_learners": 4, "epochs": 1, "minibatches": 1},
         "stop": {"env_steps": 4 * 128 * 55, "solve_on_target": False,
                  "eval_every_updates": 0}, "checkpoint": {"every_s": 0}},
        client=local_client, run_dir=run)
    learners = _records(run, "learner")
    by_version = collections.defaultdict(list)
    for r in learners:
        by_version[r["version_pulled"]].append(r)
    assert len(by_version) >= 50 and result.summary["updates"] >= 50
    for version, group in by_version.items():
        assert len(group) == 4, (version, len(group))
        assert all(r["staleness"] == 0 for r in group)
        applied = [r for r in group if r["status"] == "applied"]
        assert len(applied) == 1 and applied[0]["version_after"] == version + 1
        assert sorted(r["status"] for r in group) == ["applied"] + ["buffered"] * 3


def test_sync_with_replay_averages_whole_rounds_replays_included(local_client, pipelines,
                                                                 tmp_path):
    """IMPACT's replay 2 under sync: each update holds a whole round, the 2 slots' first uses
    and their 2 replays, all computed on the same version (no partial round of late replays)."""
    run = tmp_path / "sync-impact"
    dask_rl.train(pipelines / "impact_cartpole.yaml", client=local_client, run_dir=run,
                  overrides=["aggregation.strategy=sync", "rollout.slots=2",
                             "learner.max_learners=2", "stop.env_steps=10240",
                             "stop.solve_on_target=false", "stop.eval_every_updates=0",
                             "checkpoint.every_s=0"])
    by_version = collections.defaultdict(list)
    for r in _records(run, "learner"):
        by_version[r["version_pulled"]].append(r)
    assert len(by_version) >= 8
    for version, group in by_version.items():
        assert sorted(r["replay"] for r in group) == [False, False, True, True], version
        assert all(r["staleness"] == 0 for r in group), version
        applied = [r for r in group if r["status"] == "applied"]
        assert len(applied) == 1 and applied[0]["version_after"] == version + 1, version


def test_ssp_never_lets_a_learner_start_beyond_its_bound(local_client, tmp_path):
    """The gate closes when a learner asks to pull while another still computes on an older
    version. Learners run fused after their rollout, so with CartPole's default 4 epochs
    (learning ~40 ms, collecting ~26 ms) two learners that pulled together push together and
    the next pull can land after both: a loaded CI run went 60k env steps that way without one
    refused read. 16 epochs make learning ~5x the collect, so a learner that pushes first
    collects and asks again while its peer still computes."""
    run = tmp_path / "ssp"
    dask_rl.train(
        {"aggregation": {"strategy": "ssp", "bound": 0}, "rollout": {"slots": 4},
         "learner": {"max_learners": 4, "epochs": 16},
         "stop": {"env_steps": 40_000, "solve_on_target": False, "eval_every_updates": 0},
         "checkpoint": {"every_s": 0}},
        client=local_client, run_dir=run)
    rounds, learners = _records(run, "round"), _records(run, "learner")
    assert rounds and all(r["ssp/max_read_gap"] == 0 for r in rounds)
    seen = (f"{len(learners)} learners on {len({r['worker'] for r in learners})} workers, "
            f"staleness {collections.Counter(r['staleness'] for r in learners)}, mean task "
            f"{sum(r['learner/task_s'] for r in learners) / len(learners):.3f} s")
    assert rounds[-1]["ssp/refused_reads"] > 0, f"the read gate never closed: {seen}"
    # every gradient is its own update, applied on arrival: nothing is buffered or averaged
    assert all(r["status"] == "applied" for r in learners)


def test_rollout_slots_and_learners_follow_the_cluster(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        def grow():
            time.sleep(4)
            cluster.scale(2)

        threading.Thread(target=grow, daemon=True).start()
        result = dask_rl.train({"stop": {"env_steps": 80_000, "solve_on_target": False},
                                "learner": {"max_learners": 4},
                                "checkpoint": {"every_s": 0}},
                               client=client, run_dir=tmp_path / "grow")
    records = read_metrics(tmp_path / "grow" / "metrics.jsonl")
    start = next(r for r in records if r["kind"] == "run" and r["event"] == "start")
    assert start["rollout_slots"] == 1
    rescales = [r for r in records if r["kind"] == "rescale"]
    assert rescales and rescales[-1]["slots"] == 2
    assert result.summary["rollout_slots"] == 2
    # learners follow the rollout slots: with two slots, two trajectories are ready at a time,
    # so two learners run at once, on both workers (a mechanism, not a timing: rates move with
    # the machine's load)
    grew = rescales[0]["time"]
    before = [r for r in records if r["kind"] == "learner" and r["time"] < grew]
    after = [r for r in records if r["kind"] == "learner" and r["time"] > grew]
    assert len(before) >= 5 and len(after) >= 5
    assert max(r["learners/in_flight"] for r in after) >= 2
    assert len({r["worker"] for r in after}) == 2


def test_tianji_step_follows_the_measured_share_of_stale_samples(pipelines, tmp_path):
    """4 learners on 2 workers x 2 threads, so that learners start from parameters newer than
    the policy that collected their data. Every gradient is applied on arrival, and its weight
    is 1 / (1 + lambda P), P recomputed here from the learner records: the share of stale
    samples (policy lag > `lag_tolerance`) over the last `window` gradients, in the order
    applied."""
    from distributed import Client, LocalCluster

    lam, window, tolerance = 2.0, 4, 1
    run = tmp_path / "tianji"
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        dask_rl.train(pipelines / "ppo_cartpole_tianji.yaml", client=client, run_dir=run,
                      overrides=["stop.env_steps=40000", "stop.solve_on_target=false",
                                 "stop.eval_every_updates=0", "checkpoint.every_s=0",
                                 f"aggregation.lam={lam}", f"aggregation.window={window}",
                                 f"aggregation.lag_tolerance={tolerance}"])
    learners = sorted(_records(run, "learner"), key=lambda r: r["version_after"])
    assert len(learners) >= 20 and all(r["status"] == "applied" for r in learners)
    assert [r["version_after"] for r in learners] == list(range(1, len(learners) + 1))
    samples: list[tuple[int, int]] = []
    shares = []
    for r in learners:
        n = r["trajectory_steps"]
        samples.append((n, n if r["policy_lag"] > tolerance else 0))
        recent = samples[-window:]
        p = sum(s for _, s in recent) / sum(n for n, _ in recent)
        shares.append(p)
        assert r["weight"] == pytest.approx(1 / (1 + lam * p)), r
    # the mechanism was exercised: some data was stale, and not all of it
    assert max(shares) > 0 and min(shares) < 1
    rounds = _records(run, "round")
    assert any(rounds[-1]["tianji/P"] == pytest.approx(p) for p in shares)
