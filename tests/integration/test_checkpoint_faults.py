"""Checkpoints under faults: a worker killed inside a replay write, the wall clock stepped.

Both with real worker processes. The replay write is slowed on the workers (the write itself
is the real one) so that the kill lands while it is in progress; the clock steps are what
``time.time`` does when NTP or an administrator sets the clock.
"""

import os
import signal
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import dask_rl
from dask_rl.checkpoint import CheckpointStore, StoreLocation, read_trajectory
from dask_rl.data.metrics import read_metrics

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

PIPELINES = Path(__file__).parents[2] / "pipelines"
_REAL_TIME = time


def _slow_replay_writes(seconds: float) -> None:
    """On a worker: every replay write waits ``seconds`` before writing (a slow disk)."""
    import dask_rl.checkpoint as checkpoint

    real = getattr(checkpoint, "_real_write_trajectory", checkpoint.write_trajectory)
    checkpoint._real_write_trajectory = real

    def slow(url, index, traj):
        time.sleep(seconds)
        return real(url, index, traj)

    checkpoint.write_trajectory = slow


def test_a_worker_killed_inside_a_replay_write_keeps_the_previous_checkpoint(tmp_path):
    import dask
    from distributed import Client, LocalCluster

    run_dir = tmp_path / "run"
    killed: dict = {}
    # A task whose worker dies fails at once (KilledWorker) instead of being run again after
    # its inputs are recomputed: the write is lost for good, as on a preempted node.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None,
                         silence_logs=50) as cluster, Client(cluster) as client:
        client.run(_slow_replay_writes, 1.0)   # the nanny's replacement worker writes fast

        def killer():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                writing = [w for w, keys in client.processing().items()
                           if any(str(k).startswith("write_replay_task") for k in keys)]
                actor = next((a for a, keys in client.run(
                    lambda dask_worker: list(dask_worker.state.actors)).items() if keys), None)
                victims = [w for w in writing if w != actor]
                if victims:
                    killed["checkpoints_before"] = sum(
                        r["kind"] == "checkpoint" for r in read_metrics(run_dir / "metrics.jsonl"))
                    pid = client.run(os.getpid, workers=[victims[0]])[victims[0]]
                    os.kill(pid, signal.SIGKILL)
                    killed["at"] = time.time()
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        result = dask_rl.train(PIPELINES / "dqn_cartpole.yaml", client=client, run_dir=run_dir,
                               # a small, quick learner: what is tested is the replay write
                               overrides=["model.hidden=[64,64]", "algo.updates_per_task=16",
                                          "algo.replay_ratio=2",
                                          "checkpoint.every_s=3", "stop.env_steps=14000",
                                          "stop.solve_on_target=false",
                                          "stop.eval_every_updates=0",
                                          "algo.learning_starts=500",
                                          "checkpoint.heartbeat_s=0.5"])
        thread.join(timeout=5)
    assert "at" in killed, "no replay write was ever seen in flight"
    records = read_metrics(run_dir / "metrics.jsonl")
    failed = [r for r in records if r["kind"] == "checkpoint_failed" and r["time"] >= killed["at"]]
    assert failed, "the checkpoint whose replay write lost its worker was published"
    # the run went on to its budget (work the dead worker held is dropped, not learned from)
    # and ended with its summary
    assert result.summary["stop_reason"] == "env_steps", result.summary
    assert result.summary["env_steps_collected"] >= 14_000, result.summary
    # every published checkpoint loads, replay included, each trajectory against its checksums
    store = CheckpointStore(StoreLocation.find(run_dir).path)
    for name in store.names():
        _, meta = store.load(name)
        sums = meta.get("replay_checksums") or []
        assert len(sums) == meta["replay"]
        for i, checksums in enumerate(sums):
            read_trajectory(store.url(name), i, checksums)


class _SteppedTime(types.ModuleType):
    """The ``time`` module as dask-rl's modules see it, with ``time()`` stepped by ``offset``
    seconds (Dask itself keeps the real clock: a step of the driver's clock alone would make
    the in-process scheduler and the workers disagree, which is not what a clock step does)."""

    def __init__(self):
        super().__init__("time")
        self.offset = 0.0

    def time(self) -> float:
        return _REAL_TIME.time() + self.offset

    def real(self) -> float:
        return _REAL_TIME.time()

    def __getattr__(self, name: str):
        return getattr(_REAL_TIME, name)


@pytest.mark.parametrize("step_s", [+10 * 86_400.0, -10 * 86_400.0])
def test_a_wall_clock_step_changes_nothing(tmp_path, local_client, monkeypatch, step_s):
    """A step forward must not spend the wall budget or fire the cadences at once; a step
    back must not stop checkpoints (the run's durations are on the monotonic clock)."""
    clock = _SteppedTime()
    for name, module in list(sys.modules.items()):
        if name.startswith("dask_rl") and getattr(module, "time", None) is _REAL_TIME:
            monkeypatch.setattr(module, "time", clock)
    run_dir = tmp_path / "run"

    def step_when_training():
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            path = run_dir / "metrics.jsonl"
            if path.exists() and sum(r["kind"] == "learner" for r in read_metrics(path)) >= 2:
                clock.offset = step_s
                return
            time.sleep(0.05)

    thread = threading.Thread(target=step_when_training, daemon=True)
    thread.start()
    t0 = time.monotonic()
    result = dask_rl.train(PIPELINES / "ppo_cartpole.yaml", client=local_client,
                           run_dir=run_dir,
                           # long enough to go on >= 6 s after the step on an idle machine
                           # (80k steps left 5.6 s there)
                           overrides=["checkpoint.every_s=1", "stop.env_steps=150000",
                                      "stop.wall_s=3600", "stop.solve_on_target=false",
                                      "stop.eval_every_updates=0"])
    took = time.monotonic() - t0
    thread.join(timeout=5)
    assert clock.offset == step_s, "the clock never stepped"
    summary = result.summary
    assert summary["stop_reason"] == "env_steps", summary   # not wall_s after a step forward
    assert summary["wall_s"] < took + 5                      # the run's own seconds
    records = read_metrics(run_dir / "metrics.jsonl")
    stepped = [r for r in records if abs(r["time"] - clock.real()) > 86_400]
    written = [r for r in stepped if r["kind"] == "checkpoint"]
    # after the step checkpoints kept their 1 s cadence: not one per loop pass (forward), not
    # none for ten days (back) but the final one
    span = max(r["time"] for r in stepped) - min(r["time"] for r in stepped)
    assert span >= 6, span
    assert span / 4 <= len(written) <= span / 0.5 + 2, (len(written), span)
