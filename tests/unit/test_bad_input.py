"""Every kind of bad input ends the CLI with exit 2 and one line, before any cluster starts.

Each case runs ``python -m dask_rl.cli train`` in a fresh interpreter and checks the exit code,
that stderr is exactly one line (no traceback), that ``distributed`` was never imported (no
cluster could have started), and that nothing saved in the run directory changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dask_rl.checkpoint import CheckpointStore
from dask_rl.config import ConfigError, load_pipeline, to_dict
from dask_rl.runtime.run_lock import RunLock

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "pipelines" / "ppo_cartpole.yaml"

# runs the CLI, then says whether distributed was imported (on stdout, after the CLI's output)
PROBE = ("import sys, runpy\n"
         "sys.argv = ['dask-rl'] + sys.argv[1:]\n"
         "try:\n"
         "    runpy.run_module('dask_rl.cli', run_name='__main__')\n"
         "finally:\n"
         "    print('DISTRIBUTED_IMPORTED' if 'distributed' in sys.modules else 'NO_CLUSTER')\n")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def _one_line_exit_2(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("dask-rl: error: ") and message in lines[0], lines[0]
    assert proc.stdout.strip().endswith("NO_CLUSTER"), proc.stdout


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("name, content, extra, message", [
    ("empty", b"", [], "empty; a pipeline names"),
    ("only-comments", b"# nothing here\n\n", [], "empty; a pipeline names"),
    ("not-utf8", b"algo:\n  name: ppo\n\xff\xfe\x00bad\n", [], "not UTF-8 text"),
    ("binary", bytes(range(256)) * 4, [], "not UTF-8 text"),
    ("alias-bomb", ALIAS_BOMB.encode(), [], "expands to more than"),
    ("too-large", b"# x\n" * (300_000), [], "larger than 1024 KiB"),
    ("a-list", b"- algo\n- env\n", [], "expected a mapping of sections"),
    ("bad-yaml", b"algo: [\n", [], "not valid YAML"),
    ("huge-num-envs", CARTPOLE.read_bytes(), ["--set", "env.num_envs=1000000000"],
     "one rollout task needs at least"),
    ("bad-override-bomb", CARTPOLE.read_bytes(),
     ["--set", "env.kwargs={a: &a [1,1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a],"
      " c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c],"
      " e: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]}"], "expands to more than"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_bad_pipeline_files(tmp_path, name, content, extra, message):
    pipeline = tmp_path / f"{name}.yaml"
    pipeline.write_bytes(content)
    proc = _cli("train", str(pipeline), "--run-dir", str(tmp_path / "run"), *extra,
                cwd=tmp_path)
    _one_line_exit_2(proc, message)
    assert not (tmp_path / "run").exists()


def _saved_run(run_dir: Path, overrides: list[str] | None = None) -> None:
    """A run directory as a finished run leaves it: metrics, a checkpoint, a summary."""
    cfg = load_pipeline(CARTPOLE, overrides)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "run"}) + "\n")
    (run_dir / "summary.json").write_text("{}")
    CheckpointStore(run_dir / "checkpoints").save(
        {"actor": {"params": np.zeros(3, np.float32)}},
        meta={"algorithm": "ppo", "env_id": "CartPole-v1", "config": to_dict(cfg)})


def test_a_fresh_run_into_a_run_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    _saved_run(run)
    before = _snapshot(run)
    proc = _cli("train", str(CARTPOLE), "--run-dir", str(run), cwd=tmp_path)
    _one_line_exit_2(proc, "already holds a run (metrics.jsonl, summary.json, checkpoints)")
    assert _snapshot(run) == before  # nothing saved was touched


@pytest.mark.parametrize("override, changed", [
    ("model.hidden=[32]", "model.hidden"),
    ("algo.clip_coef=0.3", "algo.clip_coef"),
    ("env.id=Acrobot-v1", "env.id"),
    ("aggregation.strategy=stellaris", "aggregation.strategy"),
])
def test_resume_with_another_model_or_algorithm_is_refused(tmp_path, override, changed):
    run = tmp_path / "run"
    _saved_run(run)
    before = _snapshot(run)
    proc = _cli("train", str(CARTPOLE), "--run-dir", str(run), "--resume", "--set", override,
                cwd=tmp_path)
    _one_line_exit_2(proc, "differs from its checkpoint in ")
    assert changed in proc.stderr
    assert _snapshot(run) == before


def test_resume_may_change_how_it_runs(tmp_path):
    from dask_rl.api import check_run_dir

    run = tmp_path / "run"
    _saved_run(run)
    cfg = load_pipeline(CARTPOLE, ["learner.lr=1e-3", "stop.env_steps=5000", "env.num_envs=8",
                                   "checkpoint.every_s=5", "cluster.n_workers=4"])
    check_run_dir(cfg, run, resume=True)  # no error


def test_resume_without_a_checkpoint(tmp_path):
    (tmp_path / "run").mkdir()
    proc = _cli("train", str(CARTPOLE), "--run-dir", str(tmp_path / "run"), "--resume",
                cwd=tmp_path)
    _one_line_exit_2(proc, "no checkpoint to resume from")


def test_a_second_driver_on_one_run_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):  # this process is a live driver of the run
        proc = _cli("train", str(CARTPOLE), "--run-dir", str(run), cwd=tmp_path)
        _one_line_exit_2(proc, f"in use by another driver (pid {os.getpid()} on")
        with pytest.raises(ConfigError, match="in use by another driver"):
            RunLock(run).acquire()
    with RunLock(run) as lock:  # released: free again
        assert lock.held


def test_a_killed_drivers_lock_is_free(tmp_path):
    """A driver killed with SIGKILL holds nothing: the kernel dropped its lock."""
    run = tmp_path / "run"
    code = ("import os, signal, sys\n"
            "from dask_rl.runtime.run_lock import RunLock\n"
            f"RunLock({str(run)!r}).acquire()\n"
            "print('held', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9 and "held" in proc.stdout
    assert json.loads((run / ".lock").read_text())["pid"] != os.getpid()  # it wrote, then died
    with RunLock(run) as lock:
        assert lock.held
        assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
