"""End to end: PPO solves CartPole on Dask, from the CLI and from Python."""

import json
import subprocess
import sys

import pytest

import dask_rl

pytestmark = pytest.mark.timeout(600)


def _check_solved(summary):
    assert summary["solved"] is True, summary
    assert summary["final_return"] >= 475
    assert summary["env_steps"] <= 300_000
    assert summary["algorithm"] == "ppo" and summary["env_id"] == "CartPole-v1"
    for key in ("updates", "wall_s", "best_return", "stop_reason", "staleness_mean",
                "staleness_max", "recoveries"):
        assert key in summary


@pytest.mark.slow
def test_cli_main_job_solves_cartpole(pipelines, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dask_rl.cli", "train", str(pipelines / "ppo_cartpole.yaml"),
         "--run-dir", str(run_dir), "--set", "cluster.dashboard=false", "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    _check_solved(summary)
    assert summary["stop_reason"] == "solved"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"run", "learner", "eval", "checkpoint"} <= kinds
    assert (run_dir / "checkpoints" / "latest").exists()
    # the saved policy evaluates as well from the command line
    ev = subprocess.run([sys.executable, "-m", "dask_rl.cli", "evaluate", str(run_dir),
                         "--episodes", "5"], capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["mean_return"] >= 400


def _reevaluate(run_dir, episodes, seed, capsys):
    """The final checkpoint, evaluated as a user would (``dask-rl evaluate``), on seeds no run
    uses."""
    from dask_rl.cli import main

    assert main(["evaluate", str(run_dir), "--episodes", str(episodes), "--seed", str(seed)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_solved_means_solved_over_five_seeds_on_a_users_cluster(local_client, pipelines,
                                                                 tmp_path, capsys):
    """Every run of the main job that says solved holds >= 475 over 100 fresh episodes, and
    the policy it keeps is the one its confirmation evaluated."""
    solved = 0
    for seed in (11, 12, 13, 14, 15):
        run_dir = tmp_path / f"seed{seed}"
        result = dask_rl.train(pipelines / "ppo_cartpole.yaml", client=local_client,
                               run_dir=run_dir, overrides=[f"seed={seed}"])
        s = result.summary
        assert json.loads((run_dir / "summary.json").read_text()) == s
        evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        confirmations = [r for r in evals if r["kind"] == "eval"
                         and r["purpose"] == "confirmation"]
        if not s["solved"]:
            assert s["stop_reason"] == "env_steps", s
            continue
        solved += 1
        _check_solved(s)
        conf = s["confirmation"]
        assert conf["episodes"] == 300 and conf["mean_return"] >= 475, s
        assert confirmations[-1]["version"] == conf["version"]
        for r in confirmations[:-1]:   # an unconfirmed target: training went on
            assert r["version"] < conf["version"], r
        again = _reevaluate(run_dir, 100, 777_000 + seed, capsys)
        # the kept policy is the confirmed one, and it holds on episodes nobody has seen
        assert again["version"] == conf["version"], (again, conf)
        assert again["mean_return"] >= 475, (seed, again, conf)
    assert solved >= 4, f"only {solved} of 5 seeds solved the main job"
    # the user's cluster is still there and clean after the runs
    assert len(local_client.scheduler_info()["workers"]) == 2


@pytest.mark.slow
def test_learners_keeping_their_own_moments_carry_them_from_task_to_task(local_client,
                                                                        pipelines, tmp_path):
    """learner.optimizer_state = local: each learner thread's Adam counts on from one task to
    the next (a fresh Adam per task would count the same steps every time), the moments
    never reach the parameter actor (its checkpoint holds none), and the main job learns."""
    from dask_rl.checkpoint import CheckpointStore

    run_dir = tmp_path / "run"
    # its claims are the moments and learning, not the confirmation rule (the five-seed test's):
    # it may stop on the bare standard (100 episodes, no margin)
    result = dask_rl.train(pipelines / "ppo_cartpole.yaml", client=local_client,
                           run_dir=run_dir, overrides=["learner.optimizer_state=local",
                                                       "stop.env_steps=100000",
                                                       "stop.confirm_episodes=100",
                                                       "stop.confirm_margin=0"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    per_task = 4 * 4  # epochs x minibatches of ppo_cartpole.yaml
    by_worker: dict[str, list[int]] = {}
    for r in records:
        if r["kind"] == "learner" and r["learner/finite"]:
            by_worker.setdefault(r["worker"], []).append(r["learner/adam_steps"])
    assert by_worker
    for steps in by_worker.values():  # one learner thread per worker: 16, 32, 48, ...
        assert all(s % per_task == 0 for s in steps), steps
        assert len(set(steps)) == len(steps) and max(steps) > per_task, steps
    state, _ = CheckpointStore(run_dir / "checkpoints").load()
    assert state["actor"]["learner_opt"] is None and state["actor"]["version"] > 0
    # it learns: an untrained policy scores ~10-40. Over 35 runs here the best greedy mean at
    # 100k steps was 361-500 (median 500); one CI run under load got 295, so the bar is 150
    assert result.summary["best_return"] >= 150, result.summary


def test_bad_input_exits_2_before_a_cluster_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner:\n  max_learners: 0\n")
    proc = subprocess.run([sys.executable, "-m", "dask_rl.cli", "train", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("dask-rl: error: learner.max_learners: must be >= 1, got 0")
