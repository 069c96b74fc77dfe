"""A hyperparameter sweep on the cluster: Optuna's TPE and median pruner over real runs, two
trials at once on one LocalCluster, and a killed sweep driver resumed without re-running
finished trials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]

SPACE = """\
learner.lr: {low: 2.0e-4, high: 3.0e-3, log: true}
algo.ent_coef: {low: 0.0, high: 0.03}
"""
# what is tested is the sweep, not the confirmation rule (the five-seed solve test's): trials
# stop on the bare standard (100 episodes, no margin), as they did before the rule was raised
SETS = ["stop.env_steps=60000", "stop.eval_every_updates=6", "checkpoint.every_s=0",
        "cluster.dashboard=false", "stop.confirm_episodes=100", "stop.confirm_margin=0"]


def _sweep(tmp_path, *extra, wait=True):
    cmd = [sys.executable, "-m", "dask_rl.cli", "sweep", str(ROOT / "pipelines" /
                                                             "ppo_cartpole.yaml"),
           "--space", str(tmp_path / "space.yaml"), "--trials", "8", "--parallel", "2",
           "--prune-warmup", "1",
           "--sweep-dir", str(tmp_path / "sweep"), *[a for s in SETS for a in ("--set", s)],
           *extra]
    if wait:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=480)
    log = open(tmp_path / "first.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _results(tmp_path):
    path = tmp_path / "sweep" / "results.json"
    return json.loads(path.read_text()) if path.exists() else {"trials": []}


def _span(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[0])["time"], json.loads(lines[-1])["time"]


def test_a_sweep_runs_trials_at_once_prunes_and_resumes_after_its_driver_is_killed(tmp_path):
    (tmp_path / "space.yaml").write_text(SPACE)
    first = _sweep(tmp_path, wait=False)
    deadline = time.time() + 300
    try:
        while True:   # kill the driver (and its cluster) once two trials have finished
            done = [t for t in _results(tmp_path)["trials"]
                    if t["state"] in ("COMPLETE", "PRUNED")]
            if len(done) >= 2:
                break
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.time() < deadline, "no trial finished"
            time.sleep(0.5)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    kept = {t["trial"]: (Path(t["run_dir"]) / "metrics.jsonl").stat().st_mtime for t in done}

    again = _sweep(tmp_path, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    trials = _results(tmp_path)["trials"]
    finished = [t for t in trials if t["state"] in ("COMPLETE", "PRUNED")]
    assert len(finished) == 8, trials
    # the trials finished before the kill were kept, not run again
    for number, mtime in kept.items():
        [row] = [t for t in trials if t["trial"] == number]
        assert row["state"] in ("COMPLETE", "PRUNED")
        assert (Path(row["run_dir"]) / "metrics.jsonl").stat().st_mtime == mtime
    assert sum(t["state"] == "PRUNED" for t in trials) >= 1, trials
    # two trials ran at once: some pair of runs overlaps in time
    spans = sorted(_span(t["run_dir"]) for t in finished)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans
    best = json.loads((tmp_path / "sweep" / "results.json").read_text())["best"]
    # the best is the complete trial with the highest final greedy return, and it learned
    # (a random CartPole policy returns ~20); whether 60k steps solve the task is PPO's claim,
    # tested by the five-seed solve test, not the sweep's
    values = [t["value"] for t in trials if t["state"] == "COMPLETE"]
    assert best["value"] == max(values), (best, trials)
    summary = json.loads((Path(best["run_dir"]) / "summary.json").read_text())
    assert summary["final_return"] == pytest.approx(best["value"])
    assert best["value"] >= 200, summary
    best_cfg = yaml.safe_load((tmp_path / "sweep" / "best.yaml").read_text())
    assert best_cfg["learner"]["lr"] == pytest.approx(best["params"]["learner.lr"])
    assert best_cfg["algo"]["ent_coef"] == pytest.approx(best["params"]["algo.ent_coef"])
    assert "| trial | state | value |" in again.stdout


# ---- interrupts and pruning (issue 33) -------------------------------------------------------
# Trials train in threads, where no signal arrives: the sweep's main thread must pass SIGINT
# and SIGTERM on to every running trial, and a pruned trial must end like an interrupted run
# (a final checkpoint and its summary), not die inside its progress callback.

LONG = ["stop.env_steps=5000000", "stop.solve_on_target=false", "stop.eval_every_updates=4",
        "checkpoint.every_s=0", "cluster.dashboard=false"]


def _start(tmp_path, space, sets, *extra):
    (tmp_path / "space.yaml").write_text(space)
    cmd = [sys.executable, "-m", "dask_rl.cli", "sweep",
           str(ROOT / "pipelines" / "ppo_cartpole.yaml"), "--space", str(tmp_path / "space.yaml"),
           "--sweep-dir", str(tmp_path / "sweep"), *[a for s in sets for a in ("--set", s)],
           *extra]
    # a session of its own: the group is the sweep and its cluster's workers, as a terminal's
    with open(tmp_path / "sweep.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _log(tmp_path):
    return (tmp_path / "sweep.log").read_text()[-4000:]


def _learning(run_dir):
    """Whether the run has learned from a trajectory (it is training, not starting)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return False
    return any('"kind": "learner"' in line for line in lines)


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def _store(run_dir):
    """A trial's checkpoint store, where its run directory says."""
    from dask_rl.checkpoint import StoreLocation

    return Path(StoreLocation.find(run_dir).path)


def _finish(proc, timeout: float) -> int:
    """The sweep's exit code, or its process group killed once ``timeout`` has passed."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c-to-the-group", "sigterm-to-the-process"])
def test_an_interrupt_stops_every_running_trial_with_its_summary(tmp_path, signum, to_group):
    sweep = tmp_path / "sweep"
    trials = [sweep / "trial-000", sweep / "trial-001"]
    proc = _start(tmp_path, SPACE, LONG, "--trials", "4", "--parallel", "2")
    try:
        deadline = time.monotonic() + 240
        while not all(_learning(t) for t in trials):
            assert proc.poll() is None, _log(tmp_path)
            assert time.monotonic() < deadline, "the two trials did not both start\n" + \
                _log(tmp_path)
            time.sleep(0.5)
        # Ctrl-C in a terminal reaches the whole group (the embedded workers ignore SIGINT);
        # `kill PID` only the sweep
        (os.killpg if to_group else os.kill)(proc.pid, signum)
        sent = time.monotonic()
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - sent
        # the bound the issue states: within 30 s, both trials stopped and the sweep exited
        assert rc is not None and took <= 30, (rc, took, _log(tmp_path))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = _log(tmp_path)
    assert rc == 130, log
    assert "sweep interrupted: trials 0, 1 stopped" in log, log
    from dask_rl.checkpoint import CheckpointStore

    for run_dir in trials:
        summary = _summary(run_dir)
        assert summary["stop_reason"] == "interrupted", summary
        assert 0 < summary["env_steps"] < 5000000, summary
        # its final checkpoint holds what it had learned when it stopped
        _, meta, _ = CheckpointStore(_store(run_dir)).load_latest_good()
        assert meta["env_steps"] == summary["env_steps"], (meta["env_steps"], summary)
    assert not (sweep / "trial-002").exists()   # no trial started after the interrupt
    results = json.loads((sweep / "results.json").read_text())
    rows = {r["trial"]: r for r in results["trials"]}
    assert {n: rows[n]["state"] for n in rows} == {0: "INTERRUPTED", 1: "INTERRUPTED"}, rows
    assert all(r["stop_reason"] == "interrupted" for r in rows.values()), rows
    assert "| 0 | INTERRUPTED |" in (sweep / "results.md").read_text()
    # not counted as complete: as for a killed driver, --resume asks for their parameters again
    assert sorted(json.loads((sweep / "interrupted.json").read_text())) == [0, 1]


# Every corner of this space is a valid pipeline, but a MountainCar trial's greedy return is
# -200 at its first evaluation (no episode of an untrained policy reaches the flag in 200 steps)
# while a CartPole trial's is >= 8: once two trials are complete, a MountainCar trial is below
# their median at its next screening and is pruned there, whatever the learning did.
PRUNE_SPACE = "env.id: {choices: [CartPole-v1, MountainCar-v0]}\n"
PRUNE_SETS = ["stop.env_steps=16384", "stop.eval_every_updates=1", "stop.eval_episodes=2",
              "checkpoint.every_s=0", "cluster.dashboard=false"]


def test_a_pruned_trial_stops_with_a_final_checkpoint_and_its_summary(tmp_path):
    from dask_rl.checkpoint import CheckpointStore

    # the random sampler's draws with seed 41: CartPole, CartPole, then MountainCar twice
    proc = _start(tmp_path, PRUNE_SPACE, PRUNE_SETS, "--trials", "4", "--parallel", "2",
                  "--prune-warmup", "0", "--sampler", "random", "--seed", "41")
    rc = _finish(proc, 400)
    assert rc == 0, _log(tmp_path)
    rows = json.loads((tmp_path / "sweep" / "results.json").read_text())["trials"]
    assert [r["params"]["env.id"] for r in rows] == ["CartPole-v1", "CartPole-v1",
                                                     "MountainCar-v0", "MountainCar-v0"], rows
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    assert pruned, rows
    for r in pruned:
        summary = _summary(Path(r["run_dir"]))
        assert summary["stop_reason"] == "pruned", summary
        assert summary["env_steps"] < 16384, summary   # stopped early, not at its budget
        # pruned on its MountainCar screenings (the first, or the first after two trials
        # were complete)
        assert r["evaluations"] and set(r["evaluations"]) == {-200.0}, r
        # and it stopped with a final checkpoint, of the policy it ended with
        _, meta, _ = CheckpointStore(_store(Path(r["run_dir"]))).load_latest_good()
        assert meta["env_steps"] == summary["env_steps"], (meta["env_steps"], summary)
    assert [r["state"] for r in rows[:2]] == ["COMPLETE", "COMPLETE"], rows


def test_trials_sharing_a_checkpoint_path_each_keep_a_loadable_store_of_their_own(tmp_path):
    # each trial is a run of its own, with its own store under <checkpoint.path>/<run-id>/
    from dask_rl.checkpoint import CheckpointStore

    shared = tmp_path / "shared-checkpoints"
    sets = ["stop.env_steps=8192", "stop.eval_every_updates=4", "checkpoint.every_s=1",
            "checkpoint.keep=2", f"checkpoint.path={shared}", "cluster.dashboard=false"]
    proc = _start(tmp_path, SPACE, sets, "--trials", "2", "--parallel", "2")
    rc = _finish(proc, 300)
    assert rc == 0, _log(tmp_path)
    rows = json.loads((tmp_path / "sweep" / "results.json").read_text())["trials"]
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"], rows
    spans = sorted(_span(r["run_dir"]) for r in rows)
    assert spans[1][0] < spans[0][1], spans   # the two wrote checkpoints at the same time
    stores = [_store(Path(r["run_dir"])) for r in rows]
    assert stores[0].resolve() != stores[1].resolve(), stores
    for row, store in zip(rows, stores):
        _, meta, _ = CheckpointStore(store).load_latest_good()
        # its own run's checkpoint, not the other trial's
        assert meta["config"]["learner"]["lr"] == pytest.approx(row["params"]["learner.lr"])
        assert meta["config"]["algo"]["ent_coef"] == pytest.approx(
            row["params"]["algo.ent_coef"])
