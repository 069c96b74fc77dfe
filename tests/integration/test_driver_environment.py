"""The driver's own environment failing: a crash loop, the scheduler gone, a full disk, Ctrl-C,
two PBT members under one checkpoint path. Real clusters, real processes, the real CLI."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import dask_rl
from dask_rl.checkpoint import CheckpointStore, StoreLocation
from dask_rl.data.metrics import read_metrics
from dask_rl.runtime.run import RunFailed
from dask_rl.runtime.run_lock import RunLock

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).parents[2]
CARTPOLE = ROOT / "pipelines" / "ppo_cartpole.yaml"
FAST = ["checkpoint.heartbeat_s=0.5", "checkpoint.actor_timeout_s=5"]


def _learners(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(r["kind"] == "learner" for r in read_metrics(path))


def _until(condition, timeout=180.0, what="a condition"):
    t0 = time.time()
    while not condition():
        if time.time() - t0 > timeout:
            raise TimeoutError(f"{what} never held")
        time.sleep(0.2)


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dask_rl.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_a_crash_loop_ends_with_exit_1_and_one_line(tmp_path):
    """The actor's worker is killed every time an actor appears: the cap ends the run."""
    from distributed import Client, LocalCluster

    run_dir = tmp_path / "run"
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        stop = threading.Event()
        kills = []

        def killer():
            while not stop.is_set():
                try:
                    held = client.run(lambda dask_worker: bool(dask_worker.state.actors))
                    for addr, has in held.items():
                        if has:
                            os.kill(client.run(os.getpid, workers=[addr])[addr],
                                    signal.SIGKILL)
                            kills.append(addr)
                except Exception:
                    pass
                time.sleep(1.0)
        thread = threading.Thread(target=killer, daemon=True)
        proc = _cli("train", str(CARTPOLE), "--address", cluster.scheduler_address,
                    "--run-dir", str(run_dir), "--no-progress", "--set",
                    "checkpoint.max_recoveries=2", *[x for s in FAST for x in ("--set", s)])
        _until(lambda: _learners(run_dir) >= 3 or proc.poll() is not None, what="learning")
        thread.start()
        _, err = proc.communicate(timeout=400)
        stop.set()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    last = _last_line(err)
    assert last.startswith("dask-rl: failed: the parameter actor was lost 3 times within"), last
    assert "--resume continues" in last
    summary = json.loads((run_dir / "summary.json").read_text())
    # a loss while the new actor loads counts toward the cap but is not a recovery of its own
    assert summary["stop_reason"] == "crash_loop" and summary["recoveries"] in (1, 2), summary
    assert CheckpointStore(run_dir / "checkpoints").load()[0]["actor"]["params"].size > 0
    assert len(kills) >= 3


def _dask(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _start_cluster(port: int) -> list[subprocess.Popen]:
    address = f"tcp://127.0.0.1:{port}"
    procs = [_dask("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                   str(port), "--dashboard-address", ":0")]
    time.sleep(2)
    procs += [_dask("distributed.cli.dask_worker", address, "--nthreads", "1",
                    "--dashboard-address", ":0") for _ in range(2)]
    return procs


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_scheduler_killed_then_resume_on_a_new_one(tmp_path):
    run_dir = tmp_path / "run"
    port = _free_port()
    procs = _start_cluster(port)
    try:
        args = ["--run-dir", str(run_dir), "--no-progress", "--set", "checkpoint.every_s=1",
                "--set", "stop.env_steps=20000", "--set", "stop.solve_on_target=false",
                *[x for s in FAST for x in ("--set", s)]]
        proc = _cli("train", str(CARTPOLE), "--address", f"tcp://127.0.0.1:{port}", *args)
        _until(lambda: _learners(run_dir) >= 10 and (run_dir / "checkpoints" / "latest")
               .exists() or proc.poll() is not None, what="learning")
        procs[0].kill()  # the scheduler: SIGKILL
        _, err = proc.communicate(timeout=300)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert proc.returncode not in (0, None), err
    assert "Traceback" not in err
    last = _last_line(err)
    assert last.startswith("dask-rl: failed: lost the scheduler"), last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "scheduler_lost"
    state, meta = CheckpointStore(run_dir / "checkpoints").load()  # latest intact
    saved_steps = meta["env_steps"]

    port = _free_port()
    procs = _start_cluster(port)
    try:
        proc = _cli("train", str(CARTPOLE), "--address", f"tcp://127.0.0.1:{port}",
                    "--resume", *args)
        out, err = proc.communicate(timeout=400)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert proc.returncode == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "env_steps" and summary["env_steps"] >= 20000
    resumes = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "resume"]
    assert resumes and resumes[-1]["env_steps"] == saved_steps


def test_ctrl_c_checkpoints_writes_a_summary_and_resume_continues(tmp_path):
    """Ctrl-C reaches the driver and the embedded workers; the workers ignore it, the driver
    stops after a final checkpoint and summary (exit 130), and --resume finishes the run."""
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), "--no-progress", "--set", "stop.env_steps=20000",
            "--set", "stop.solve_on_target=false", "--set", "checkpoint.every_s=0"]
    proc = _cli("train", str(CARTPOLE), *args, start_new_session=True)
    _until(lambda: _learners(run_dir) >= 10 or proc.poll() is not None, what="learning")
    # as a terminal does: to the whole process group, the embedded cluster's workers too
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _last_line(err).startswith("dask-rl: interrupted after"), err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["env_steps"] > 0
    assert summary["recoveries"] == 0  # the actor's worker did not die of the Ctrl-C
    _, meta = CheckpointStore(run_dir / "checkpoints").load()
    assert meta["env_steps"] == summary["env_steps"]  # the final checkpoint is the summary's
    RunLock(run_dir).check()  # the driver let go of its run directory

    proc = _cli("train", str(CARTPOLE), "--resume", *args)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "env_steps" and summary["env_steps"] >= 20000


def test_a_full_disk_at_a_checkpoint_and_at_a_metrics_write(local_client, tmp_path,
                                                           monkeypatch):
    """ENOSPC on one checkpoint commit and on metrics writes: the run goes on, ``latest``
    stays a good checkpoint, and the failures are counted."""
    from dask_rl.data import metrics as metrics_module

    real_commit = CheckpointStore.commit
    commits = {"n": 0, "failed": None}

    def commit(self, pending, state, **kwargs):
        commits["n"] += 1
        if commits["n"] == 2:  # the first after the run's initial checkpoint
            commits["failed"] = pending.name
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_commit(self, pending, state, **kwargs)
    monkeypatch.setattr(CheckpointStore, "commit", commit)

    real_write = metrics_module.MetricsLog.write
    writes = {"n": 0}

    def write(self, kind, record):
        writes["n"] += kind == "learner"
        if kind == "learner" and 20 <= writes["n"] < 30 and not hasattr(self._file, "_full"):
            real_file = self._file

            class Full:
                _full = True

                def write(self, text):
                    raise OSError(errno.ENOSPC, "No space left on device")

                def close(self):
                    real_file.close()
            self._file = Full()
            try:
                return real_write(self, kind, record)
            finally:
                self._file = real_file
        return real_write(self, kind, record)
    monkeypatch.setattr(metrics_module.MetricsLog, "write", write)

    run_dir = tmp_path / "run"
    result = dask_rl.train(CARTPOLE, client=local_client, run_dir=run_dir,
                           overrides=["checkpoint.every_s=1", "stop.env_steps=24000",
                                      "stop.solve_on_target=false"])
    s = result.summary
    assert commits["failed"] is not None and s["env_steps"] >= 24000
    # a later commit went through (at least the final one), so latest is the run's end
    assert commits["n"] >= 3, commits
    records = read_metrics(run_dir / "metrics.jsonl")
    assert any(r["kind"] == "checkpoint_failed" for r in records)
    store = CheckpointStore(run_dir / "checkpoints")
    state, meta = store.load()  # latest: a good checkpoint of the end of the run
    assert meta["env_steps"] == s["env_steps"]
    assert writes["n"] > 30
    learner_records = sum(r["kind"] == "learner" for r in records)
    assert learner_records == writes["n"] - 10  # the 10 lost records are lost, nothing else


def test_pbt_members_under_one_checkpoint_path_keep_their_own_stores(local_client, tmp_path):
    path = f"memory://dask-rl-pbt-{os.getpid()}/ck"
    result = dask_rl.train(ROOT / "pipelines" / "pbt_cartpole.yaml", client=local_client,
                           run_dir=tmp_path / "pbt",
                           overrides=[f"checkpoint.path={path}", "stop.env_steps=12000",
                                      "checkpoint.every_s=1"])
    members = result.summary["members"] if "members" in result.summary else None
    n = 4 if members is None else len(members)
    seeds, stores = set(), set()
    for i in range(n):
        where = StoreLocation.find(tmp_path / "pbt" / "members" / f"m{i}")
        assert where.path.startswith(f"{path}/m{i}-")   # <checkpoint.path>/<run-id>
        state, meta = CheckpointStore(where.path).load()
        seeds.add(meta["config"]["seed"])
        stores.add(where.path)
        assert meta["run_id"] == where.run_id
    assert len(seeds) == len(stores) == n  # each member's store holds that member, never another
    population = StoreLocation.find(tmp_path / "pbt")
    assert population.path not in stores
    assert CheckpointStore(population.path).load()[1]["algorithm"] == "pbt-ppo"


def test_secrets_in_pod_env_never_reach_metrics_or_checkpoints(local_client, tmp_path):
    secret = "s3cr3t-value-that-must-not-leak"
    run_dir = tmp_path / "run"
    dask_rl.train(CARTPOLE, client=local_client, run_dir=run_dir,
                  overrides=[f"cluster.kubernetes.env={{AWS_SECRET_ACCESS_KEY: {secret}}}",
                             "stop.env_steps=2048"])
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_workers_paused_for_memory_end_the_run_instead_of_stalling_it(tmp_path):
    """Every worker paused for memory mid-run runs nothing, ever: the watchdog ends the run
    with one line (exit 1) and a summary, instead of a run that never ends."""
    from distributed import Client, LocalCluster

    run_dir = tmp_path / "run"
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        def pause_all():
            _until(lambda: _learners(run_dir) >= 5, what="learning")

            def tiny(dask_worker):  # as if the workers' data outgrew their memory
                dask_worker.memory_manager.memory_limit = 1
            client.run(tiny)
        thread = threading.Thread(target=pause_all, daemon=True)
        thread.start()
        with pytest.raises(RunFailed,
                           match="all 2 workers are paused for memory"):
            dask_rl.train(CARTPOLE, client=client, run_dir=run_dir,
                          overrides=["checkpoint.stall_s=10", "stop.solve_on_target=false"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "stalled" and summary["env_steps"] > 0


def test_an_unexpected_error_in_the_loop_ends_with_one_line_a_summary_and_its_traceback(
        local_client, tmp_path):
    run_dir = tmp_path / "run"
    calls = []

    def progress(p):   # the user's callback, failing in the middle of training
        calls.append(p.env_steps)
        if len(calls) == 20:
            raise ZeroDivisionError("the user's progress callback broke")

    with pytest.raises(RunFailed) as failed:
        dask_rl.train(CARTPOLE, client=local_client, run_dir=run_dir, progress=progress,
                      overrides=["stop.env_steps=200000", "stop.solve_on_target=false",
                                 "checkpoint.every_s=1"])
    message = str(failed.value)
    assert "\n" not in message and "ZeroDivisionError" in message and "traceback.txt" in message
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["env_steps"] > 0, summary
    assert "progress callback broke" in (run_dir / "traceback.txt").read_text()
    # what was saved is intact: the latest checkpoint loads
    CheckpointStore(StoreLocation.find(run_dir).path).load()
