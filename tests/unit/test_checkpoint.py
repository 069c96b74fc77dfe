"""Zarr checkpoints: round trips, atomic publication, refusal of foreign or damaged ones."""

import numpy as np
import pytest

from dask_rl.checkpoint import CheckpointError, CheckpointStore


def _state(i=0):
    return {"actor": {"params": np.arange(10, dtype=np.float32) + i, "version": i,
                      "optimizer": {"t": 2, "m": np.ones(10, np.float32)},
                      "strategy": {"name": "async", "histogram": np.zeros(4, np.int64)}},
            "driver": {"env_steps": 100 * i, "recent_returns": [1.0, 2.5], "best": None}}


def test_roundtrip_is_bit_identical(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    state = _state(3)
    store.save(state, meta={"algorithm": "ppo"})
    loaded, meta = store.load()
    np.testing.assert_array_equal(loaded["actor"]["params"], state["actor"]["params"])
    assert loaded["actor"]["params"].dtype == np.float32
    assert loaded["actor"]["optimizer"]["t"] == 2
    assert loaded["driver"] == state["driver"]
    assert meta == {"algorithm": "ppo", "replay": 0}


def test_keep_prunes_old_checkpoints_and_latest_moves(tmp_path):
    store = CheckpointStore(tmp_path / "ck", keep=2)
    names = [store.save(_state(i)) for i in range(4)]
    assert store.names() == names[-2:]
    assert store.latest() == names[-1]
    assert store.load()[0]["actor"]["version"] == 3


def test_memory_url(tmp_path):
    store = CheckpointStore("memory://dask-rl-test/ck")
    store.save(_state(1))
    assert store.load()[0]["actor"]["version"] == 1


def test_expectations(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    store.save(_state(), meta={"algorithm": "impact"})
    with pytest.raises(CheckpointError, match="algorithm='impact', this run has "
                                              "algorithm='ppo'"):
        store.load(expect={"algorithm": "ppo"})
    with pytest.raises(CheckpointError, match="holds 10 parameters, the model of this pipeline "
                                              "has 12"):
        store.load(expect={"num_params": 12})


def test_objects_are_never_written():
    with pytest.raises(TypeError, match="dtype object"):
        CheckpointStore("memory://dask-rl-test/obj").save({"x": np.array([object()])})
    with pytest.raises(TypeError, match="cannot checkpoint set"):
        CheckpointStore("memory://dask-rl-test/obj2").save({"x": {1, 2}})


def test_nothing_to_resume(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        CheckpointStore(tmp_path / "empty").load()


def _trajectory():
    from dask_rl.data import Trajectory

    rng = np.random.default_rng(0)
    return Trajectory(obs=rng.normal(size=(5, 2, 3)).astype(np.float32),
                      actions=rng.integers(0, 2, (5, 2)), rewards=np.ones((5, 2), np.float32),
                      terminated=np.zeros((5, 2), bool), truncated=np.zeros((5, 2), bool),
                      behaviour_logp=np.zeros((5, 2), np.float32),
                      last_obs=np.zeros((2, 3), np.float32),
                      trunc_index=np.zeros((0, 2), np.int32),
                      trunc_obs=np.zeros((0, 3), np.float32), policy_version=7,
                      episode_returns=np.array([3.0]), moments={"obs": np.arange(7.0)},
                      collect_s=0.25)


@pytest.mark.parametrize("root", ["local", "memory://dask-rl-test/replay"])
def test_replay_data_written_beside_the_state(tmp_path, root):
    from dask_rl.checkpoint import read_trajectory, write_trajectory

    store = CheckpointStore(tmp_path / "ck" if root == "local" else root)
    pending = store.begin()
    traj = _trajectory()
    sums = [write_trajectory(pending.url, 0, traj), write_trajectory(pending.url, 1, traj)]
    name = store.commit(pending, _state(2), meta={"algorithm": "impact"}, replay=2,
                        replay_checksums=sums)
    state, meta = store.load()
    assert meta["replay"] == 2 and state["actor"]["version"] == 2
    assert meta["replay_checksums"] == sums and "obs" in sums[0] and "moments/obs" in sums[0]
    back = read_trajectory(store.url(name), 1, meta["replay_checksums"][1])
    np.testing.assert_array_equal(back.obs, traj.obs)
    np.testing.assert_array_equal(back.moments["obs"], traj.moments["obs"])
    assert back.policy_version == 7 and back.collect_s == 0.25


def test_damaged_latest_falls_back_to_the_previous_good_checkpoint(tmp_path, caplog):
    import shutil

    store = CheckpointStore(tmp_path / "ck", keep=3)
    store.save(_state(1), meta={"algorithm": "ppo"})
    newest = store.save(_state(2), meta={"algorithm": "ppo"})
    shutil.rmtree(tmp_path / "ck" / newest / "actor" / "params")  # a truncated write
    with pytest.raises(CheckpointError, match=f"{newest}: array actor/params is damaged or "
                                              "missing"):
        store.load()
    state, _, name = store.load_latest_good(expect={"algorithm": "ppo"})
    assert name != newest and state["actor"]["version"] == 1
    assert "skipping a damaged checkpoint" in caplog.text


def test_future_format_and_garbage_are_refused(tmp_path):
    import json

    store = CheckpointStore(tmp_path / "ck")
    name = store.save(_state(1))
    meta_file = tmp_path / "ck" / name / "zarr.json"
    doc = json.loads(meta_file.read_text())
    doc["attributes"]["format_version"] = 99
    meta_file.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="format version 99 is newer"):
        store.load()
    (tmp_path / "ck" / name / "zarr.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot open checkpoint"):
        store.load()
    (tmp_path / "ck" / "latest").write_text("../../etc/passwd\n")
    with pytest.raises(CheckpointError, match="not a checkpoint pointer"):
        store.latest()


def test_replay_written_before_the_slot_was_named_still_reads(tmp_path):
    import dataclasses

    import zarr

    from dask_rl.checkpoint import read_trajectory, write_trajectory

    store = CheckpointStore(tmp_path / "ck")
    pending = store.begin()
    sums = [write_trajectory(pending.url, 0, dataclasses.replace(_trajectory(), slot=3))]
    group = zarr.open_group(pending.url, mode="a")["replay/0"]
    scalars = dict(group.attrs["trajectory"])
    scalars["actor_id"] = scalars.pop("slot")  # the field's name until the layout change
    del scalars["pull_s"]                       # added later: its default
    group.attrs["trajectory"] = scalars
    name = store.commit(pending, _state(1), meta={"algorithm": "impact"}, replay=1,
                        replay_checksums=sums)
    back = read_trajectory(store.url(name), 0)
    assert back.slot == 3 and back.pull_s == 0.0


def test_a_replay_commit_needs_every_writes_checksums(tmp_path):
    from dask_rl.checkpoint import write_trajectory

    store = CheckpointStore(tmp_path / "ck")
    store.save(_state(1), meta={"algorithm": "impact"})
    pending = store.begin()
    sums = [write_trajectory(pending.url, 0, _trajectory())]   # the second write never came
    with pytest.raises(CheckpointError, match="2 replay trajectories written, checksums for 1"):
        store.commit(pending, _state(2), meta={"algorithm": "impact"}, replay=2,
                     replay_checksums=sums)
    state, _ = store.load()
    assert state["actor"]["version"] == 1   # the previous checkpoint is still latest


def test_replay_reads_check_checksums_and_every_dtype(tmp_path):
    import zarr

    from dask_rl.checkpoint import read_trajectory, write_trajectory

    store = CheckpointStore(tmp_path / "ck")
    pending = store.begin()
    sums = [write_trajectory(pending.url, i, _trajectory()) for i in range(4)]
    name = store.commit(pending, _state(1), meta={"algorithm": "impact"}, replay=4,
                        replay_checksums=sums)
    url = store.url(name)
    root = zarr.open_group(url, mode="a")
    # 0: an array's bytes changed after the checksum was taken (a torn or altered write)
    root["replay/0/rewards"][0, 0] = 99.0
    zarr.consolidate_metadata(url)
    with pytest.raises(CheckpointError, match="replay/0/rewards is damaged"):
        read_trajectory(url, 0, sums[0])
    # 1: a moments entry (the dict-of-arrays branch) replaced by an object array
    del root["replay/1/moments/obs"]
    root["replay/1"].create_array("moments/obs", shape=(1,), dtype=str)
    zarr.consolidate_metadata(url)
    with pytest.raises(CheckpointError, match="moments/obs has dtype"):
        read_trajectory(url, 1, sums[1])
    # 2: a scalar attribute that is not what a Trajectory holds
    group = root["replay/2"]
    attrs = dict(group.attrs["trajectory"])
    attrs["policy_version"] = {"__class__": "os.system"}
    group.attrs["trajectory"] = attrs
    zarr.consolidate_metadata(url)
    with pytest.raises(CheckpointError, match="policy_version: unexpected value"):
        read_trajectory(url, 2, sums[2])
    # 3: untouched, reads back
    assert read_trajectory(url, 3, sums[3]).policy_version == 7


def test_a_run_owns_its_store_under_a_shared_path(tmp_path):
    from dask_rl.checkpoint import StoreLocation, StoreLocationError

    shared = tmp_path / "shared"
    a = StoreLocation.create(tmp_path / "runs" / "a", checkpoint_path=str(shared))
    b = StoreLocation.create(tmp_path / "runs" / "b", checkpoint_path=str(shared))
    assert a.path != b.path and a.run_id != b.run_id
    assert a.path.startswith(str(shared)) and a.run_id.startswith("a-")
    assert StoreLocation.find(tmp_path / "runs" / "a") == a
    # the default lives in the run directory, recorded relative to it (the run can move)
    c = StoreLocation.create(tmp_path / "runs" / "c")
    (tmp_path / "runs" / "c").rename(tmp_path / "moved")
    assert StoreLocation.find(tmp_path / "moved").path == str(tmp_path / "moved" / "checkpoints")
    assert StoreLocation.find(tmp_path / "moved").run_id == c.run_id
    # older run directories: checkpoints/ if there, else the shared path; else nothing
    (tmp_path / "old" / "checkpoints").mkdir(parents=True)
    assert StoreLocation.find(tmp_path / "old") == StoreLocation(
        str(tmp_path / "old" / "checkpoints"), None)
    assert StoreLocation.find(tmp_path / "none") is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "store.json").write_text('{"path": 3}')
    with pytest.raises(StoreLocationError, match="not a dask-rl store record"):
        StoreLocation.find(tmp_path / "bad")
