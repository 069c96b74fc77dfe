"""Runs that share ``checkpoint.path`` never touch each other's checkpoints.

Before stores belonged to runs, run B's pruning deleted run A's checkpoints, ``--resume`` of A
continued B's, and two runs writing at once left every checkpoint unloadable.
"""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import dask_rl
from dask_rl.checkpoint import CheckpointStore, StoreLocation
from dask_rl.data.metrics import read_metrics

pytestmark = pytest.mark.timeout(600)

PIPELINE = Path(__file__).parents[2] / "pipelines" / "ppo_cartpole.yaml"


def _short(shared: Path, seed: int, steps: int = 12_000) -> list[str]:
    return [f"checkpoint.path={shared}", "checkpoint.every_s=0.2", "checkpoint.keep=2",
            f"seed={seed}", f"stop.env_steps={steps}", "stop.solve_on_target=false",
            "stop.eval_every_updates=0", "cluster.dashboard=false"]


def _every_checkpoint_loads(run_dir: Path) -> tuple[StoreLocation, list[str]]:
    where = StoreLocation.find(run_dir)
    assert where is not None and where.run_id is not None
    store = CheckpointStore(where.path)
    names = store.names()
    assert names and store.latest() == names[-1]
    for name in names:
        _, meta = store.load(name)
        assert meta["run_id"] == where.run_id
    return where, names


def test_runs_in_turn_on_one_path_keep_their_own_checkpoints_and_resume_their_own(
        tmp_path, local_client):
    shared = tmp_path / "shared"
    a, b = tmp_path / "a", tmp_path / "b"
    dask_rl.train(PIPELINE, client=local_client, run_dir=a, overrides=_short(shared, 1))
    where_a, names_a = _every_checkpoint_loads(a)
    dask_rl.train(PIPELINE, client=local_client, run_dir=b, overrides=_short(shared, 2))
    where_b, _ = _every_checkpoint_loads(b)
    assert where_a.path != where_b.path
    assert Path(where_a.path).parent == Path(where_b.path).parent == shared
    # B's pruning left A's checkpoints alone
    assert CheckpointStore(where_a.path).names() == names_a
    # the tools find A's store through its run directory (nothing under a/checkpoints)
    assert not (a / "checkpoints").exists()
    evaluated = subprocess.run([sys.executable, "-m", "dask_rl.cli", "evaluate", str(a),
                                "--episodes", "2"], capture_output=True, text=True, timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads(evaluated.stdout)["checkpoint"] == names_a[-1]
    saved_a = CheckpointStore(where_a.path).load()[1]
    # --resume of A continues A (its seed, its env steps), never B's newer checkpoint
    result = dask_rl.train(PIPELINE, client=local_client, run_dir=a, resume=True,
                           overrides=_short(shared, 1, steps=16_000))
    resume = [r for r in read_metrics(a / "metrics.jsonl") if r["kind"] == "resume"]
    assert resume and resume[-1]["checkpoint"] == names_a[-1]
    assert resume[-1]["env_steps"] == saved_a["env_steps"]
    assert result.summary["env_steps"] >= 16_000
    _every_checkpoint_loads(a)
    _every_checkpoint_loads(b)


def test_runs_at_once_on_one_path_leave_every_checkpoint_loadable(tmp_path, local_client):
    shared = tmp_path / "shared"
    runs = [tmp_path / "a", tmp_path / "b"]
    results, errors = {}, []

    def train(i: int) -> None:
        try:
            results[i] = dask_rl.train(PIPELINE, client=local_client, run_dir=runs[i],
                                       overrides=_short(shared, i + 1, steps=16_000))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    assert not errors, errors
    for run in runs:
        records = read_metrics(run / "metrics.jsonl")
        written = [r for r in records if r["kind"] == "checkpoint"]
        assert len(written) >= 3   # both wrote at once, many times over
        assert not [r for r in records if r["kind"] == "checkpoint_failed"]
        _every_checkpoint_loads(run)
    assert len({StoreLocation.find(r).path for r in runs}) == 2


def test_resuming_from_another_runs_store_is_one_line(tmp_path, local_client):
    shared = tmp_path / "shared"
    a, b = tmp_path / "a", tmp_path / "b"
    for run, seed in ((a, 1), (b, 2)):
        dask_rl.train(PIPELINE, client=local_client, run_dir=run,
                      overrides=_short(shared, seed, steps=4_000))
    # a's record pointed at b's store (copied by hand, or a store moved under it)
    record = json.loads((a / "store.json").read_text())
    record["path"] = StoreLocation.find(b).path
    (a / "store.json").write_text(json.dumps(record))
    cmd = [sys.executable, "-m", "dask_rl.cli", "train", str(PIPELINE), "--run-dir", str(a),
           "--resume", "--no-progress"]
    for override in _short(shared, 1, steps=8_000):
        cmd += ["--set", override]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run_id" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
