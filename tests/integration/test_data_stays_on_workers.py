"""No trajectory passes through the client: bytes the client receives vs bytes produced."""

import contextvars

import pytest

import dask_rl

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_client_receives_far_fewer_bytes_than_trajectories(monkeypatch, tmp_path):
    import distributed.comm.tcp as tcp
    from distributed import Client, LocalCluster

    # Results come straight from workers (direct_to_workers), so every read on a connection
    # this process opened is the client's, and the in-process scheduler's reads are the ones
    # on the connections it accepted.
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster:
        with Client(cluster, direct_to_workers=True) as client:
            _measure(client, monkeypatch, tmp_path, tcp)


def _measure(client, monkeypatch, tmp_path, tcp):
    scheduler = client.scheduler.address
    reader = contextvars.ContextVar("reader", default=None)
    received = {"bytes": 0, "largest": 0, "messages": 0, "scheduler_side": 0}
    original_read, original_from_frames = tcp.TCP.read, tcp.from_frames

    async def read(self, deserializers=None):
        token = reader.set(self.local_address)
        try:
            return await original_read(self, deserializers)
        finally:
            reader.reset(token)

    async def from_frames(frames, *args, **kwargs):
        n = sum(memoryview(f).nbytes for f in frames)
        if reader.get() == scheduler:  # the in-process scheduler's side of a connection
            received["scheduler_side"] += n
        else:  # the client's side: what the driver itself receives
            received["bytes"] += n
            received["largest"] = max(received["largest"], n)
            received["messages"] += 1
        return await original_from_frames(frames, *args, **kwargs)

    monkeypatch.setattr(tcp.TCP, "read", read)
    monkeypatch.setattr(tcp, "from_frames", from_frames)
    samples = 32 * 256
    result = dask_rl.train({"env": {"num_envs": 32}, "rollout": {"steps": 256},
                            "stop": {"env_steps": 200_000, "eval_every_updates": 0},
                            "checkpoint": {"every_s": 0}},
                           client=client, run_dir=tmp_path / "bytes")
    s = result.summary
    produced = s["trajectory_bytes"]
    per_trajectory = produced / (s["env_steps"] / samples)
    print(f"client received {received}, trajectories produced {produced} bytes")
    assert produced > 4_000_000
    assert received["messages"] > 0 and received["scheduler_side"] > 0
    # everything the client received (statistics, task states, the final checkpoint's
    # parameters) is far below the trajectories produced, and no message is trajectory-sized
    assert received["bytes"] < 0.05 * produced, (received, produced)
    assert received["largest"] < 0.5 * per_trajectory, (received, per_trajectory)
