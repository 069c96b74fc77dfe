"""Learning with the staleness-aware strategies and the off-policy learner, 2 workers."""

import threading
import time

import pytest

import dask_rl
from dask_rl.data.metrics import read_metrics

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_stellaris_solves_cartpole(local_client, pipelines, tmp_path):
    result = dask_rl.train(pipelines / "ppo_cartpole_stellaris.yaml", client=local_client,
                           run_dir=tmp_path / "stellaris")
    s = result.summary
    assert s["solved"] and s["final_return"] >= 475, s
    assert s["strategy"] == "stellaris"
    records = read_metrics(tmp_path / "stellaris" / "metrics.jsonl")
    rounds = [r for r in records if r["kind"] == "round"]
    assert rounds, "no per-round metrics"
    for key in ("staleness/mean", "staleness/max", "staleness/histogram", "gradients/applied",
                "gradients/buffered", "gradients/dropped", "learners/active", "lr_scale",
                "threshold/beta"):
        assert key in rounds[-1], key
    learners = [r for r in records if r["kind"] == "learner"]
    assert all(r["status"] in ("applied", "buffered", "dropped") for r in learners)
    assert all("staleness" in r for r in learners)


def test_impact_solves_cartpole_with_stellaris(local_client, pipelines, tmp_path):
    result = dask_rl.train(pipelines / "impact_cartpole.yaml", client=local_client,
                           run_dir=tmp_path / "impact")
    s = result.summary
    assert s["algorithm"] == "impact" and s["strategy"] == "stellaris"
    assert s["solved"] and s["final_return"] >= 475, s
    learners = read_metrics(tmp_path / "impact" / "metrics.jsonl")
    learners = [r for r in learners if r["kind"] == "learner"]
    assert any(r["replay"] for r in learners), "the circular buffer never replayed a batch"
    assert all("losses/is_weight" in r for r in learners)


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
