"""TianJi's controls on 2 worker processes: the mechanism first, then learning.

The sample-staleness controller drives P = B_s / N_s under its tolerance and the learning
rate follows alpha / (1 + lambda P); event-triggered pulls move the policy less often and
rollouts then act with older versions; double DQN on the replay path solves CartPole through
the CLI.
"""

import json
import subprocess
import sys

import pytest

import dask_rl
from dask_rl.data.metrics import read_metrics

pytestmark = [pytest.mark.timeout(600)]


def _records(run_dir, kind):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


def test_a_buffer_too_small_for_the_batch_is_grown_then_the_batch_shrinks(local_client,
                                                                           pipelines, tmp_path):
    # trajectories of 50 x 4 = 200 transitions; B_s = 128 over N_s = 400: P = 0.32 > 0.2 ->
    # the buffer grows to its cap (600), where P = 0.213 is still above: the batch shrinks
    # to floor(0.2 x 600) = 120
    run = tmp_path / "small"
    result = dask_rl.train(pipelines / "dqn_cartpole.yaml", client=local_client, run_dir=run,
                           overrides=["rollout.steps=50", "algo.buffer_size=400",
                                      "algo.max_buffer_size=600", "algo.learning_starts=400",
                                      "algo.staleness_lambda=2",
                                      "algo.updates_per_task=4", "stop.env_steps=12000",
                                      "stop.solve_on_target=false"])
    assert result.summary["stop_reason"] == "env_steps"
    replay = _records(run, "replay")
    assert replay, "no sampled learner ran"
    actions = [r["action"] for r in replay if r["action"]]
    assert actions[:2] == ["grow_buffer", "shrink_batch"], actions
    assert replay[0]["held"] == 400 and replay[0]["staleness_ratio"] == pytest.approx(0.32)
    full = [r for r in replay if r["held"] >= 600]
    # once the buffer is full at its cap, P stays at or under the tolerance
    assert full and all(r["staleness_ratio"] <= 0.2 + 1e-9 for r in full)
    assert replay[-1]["batch"] == 120 and replay[-1]["capacity"] == 600
    for r in replay:  # P = B_s / N_s of what was held, and TianJi's alpha / (1 + lambda P)
        p = r["batch"] / r["held"]
        assert r["staleness_ratio"] == pytest.approx(p)
        assert r["lr"] == pytest.approx(r["lr_base"] / (1 + 2 * p))
    # each learner took its gradient steps at the batch and rate its replay record set
    set_by = {r["learner"]: r for r in replay}
    learners = _records(run, "learner")
    assert learners
    for r in learners:
        assert r["learner/batch"] == set_by[r["learner"]]["batch"]
        assert r["learner/lr"] == pytest.approx(set_by[r["learner"]]["lr"])


def _rollout_pulls(local_client, pipelines, run, pull_every):
    result = dask_rl.train(pipelines / "ppo_cartpole.yaml", client=local_client, run_dir=run,
                           overrides=[f"rollout.pull_every={pull_every}",
                                      "stop.env_steps=30000", "stop.solve_on_target=false",
                                      "stop.eval_every_updates=0", "checkpoint.every_s=0"])
    rounds = _records(run, "round")
    lag = [r["policy_lag"] for r in _records(run, "learner")]
    asked = rounds[-1]["actor/pulls_sent"] + rounds[-1]["actor/pulls_unchanged"]
    return asked, sum(lag) / len(lag), result.summary


def test_event_triggered_pulls_ask_less_often_and_act_with_older_policies(local_client,
                                                                          pipelines, tmp_path):
    asked_1, lag_1, s1 = _rollout_pulls(local_client, pipelines, tmp_path / "every", 1)
    asked_4, lag_4, s4 = _rollout_pulls(local_client, pipelines, tmp_path / "fourth", 4)
    learners_1, learners_4 = s1["gradients_applied"], s4["gradients_applied"]
    # learners pull once each in both runs; rollouts every rollout, or every fourth
    rollouts_1, rollouts_4 = asked_1 - learners_1, asked_4 - learners_4
    assert rollouts_4 < 0.5 * rollouts_1, (rollouts_1, rollouts_4)
    assert lag_4 > lag_1, (lag_1, lag_4)


@pytest.mark.slow
def test_dqn_solves_cartpole_through_the_cli(pipelines, tmp_path):
    run = tmp_path / "dqn"
    proc = subprocess.run(
        [sys.executable, "-m", "dask_rl.cli", "train", str(pipelines / "dqn_cartpole.yaml"),
         "--run-dir", str(run), "--set", "cluster.dashboard=false", "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["algorithm"] == "dqn" and s["solved"], s
    assert s["confirmation"]["episodes"] == 100 and s["confirmation"]["mean_return"] >= 475
