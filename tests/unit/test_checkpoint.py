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
    write_trajectory(pending.url, 0, traj)
    write_trajectory(pending.url, 1, traj)
    name = store.commit(pending, _state(2), meta={"algorithm": "impact"}, replay=2)
    state, meta = store.load()
    assert meta["replay"] == 2 and state["actor"]["version"] == 2
    back = read_trajectory(store.url(name), 1)
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
    write_trajectory(pending.url, 0, dataclasses.replace(_trajectory(), slot=3))
    group = zarr.open_group(pending.url, mode="a")["replay/0"]
    scalars = dict(group.attrs["trajectory"])
    scalars["actor_id"] = scalars.pop("slot")  # the field's name until the layout change
    group.attrs["trajectory"] = scalars
    name = store.commit(pending, _state(1), meta={"algorithm": "impact"}, replay=1)
    assert read_trajectory(store.url(name), 0).slot == 3
