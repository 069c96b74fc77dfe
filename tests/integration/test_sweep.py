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
SETS = ["stop.env_steps=60000", "stop.eval_every_updates=6", "checkpoint.every_s=0",
        "cluster.dashboard=false"]


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
    summary = json.loads((Path(best["run_dir"]) / "summary.json").read_text())
    assert summary["solved"], summary
    best_cfg = yaml.safe_load((tmp_path / "sweep" / "best.yaml").read_text())
    assert best_cfg["learner"]["lr"] == pytest.approx(best["params"]["learner.lr"])
    assert best_cfg["algo"]["ent_coef"] == pytest.approx(best["params"]["algo.ent_coef"])
    assert "| trial | state | value |" in again.stdout
