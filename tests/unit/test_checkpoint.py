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
    assert meta == {"algorithm": "ppo"}


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
